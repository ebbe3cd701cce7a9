"""Server settings: validated on construction, immutable afterwards; loaded from plain data with cattrs."""

import attrs
import cattrs


def _check_port(instance, attribute, value):
    if not 0 < value < 65535:
        raise ValueError(f"{attribute.name} must be in 1..65535, got {value}")


def _check_workers(instance, attribute, value):
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8080, converter=int, validator=_check_port)
    workers: int = attrs.field(default=1, converter=int, validator=_check_workers)

    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


_converter = cattrs.Converter(forbid_extra_keys=False)


def from_mapping(data: dict) -> ServerConfig:
    """Build a config from a mapping (e.g. parsed TOML), ignoring keys it does not know."""
    return _converter.structure(data, ServerConfig)


def to_mapping(cfg: ServerConfig) -> dict:
    return _converter.unstructure(cfg)
