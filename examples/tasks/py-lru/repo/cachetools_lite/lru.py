"""A least-recently-used cache on top of OrderedDict."""

from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """Mapping that holds at most ``capacity`` entries, evicting the least recently used one."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._data = OrderedDict()

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        elif len(self._data) > self.capacity:
            self._data.popitem(last=False)
        self._data[key] = value

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def clear(self):
        self._data.clear()
        self.hits = self.misses = 0
