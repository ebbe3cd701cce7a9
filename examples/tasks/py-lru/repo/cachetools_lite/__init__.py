from .decorators import memoize
from .lru import LRUCache

__all__ = ["LRUCache", "memoize"]
