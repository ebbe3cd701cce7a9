from .server import ServerConfig, from_mapping, to_mapping

__all__ = ["ServerConfig", "from_mapping", "to_mapping"]
