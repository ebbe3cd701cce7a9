"""Memoisation backed by an LRUCache."""

import functools

from .lru import LRUCache


def memoize(capacity=128):
    def decorator(func):
        cache = LRUCache(capacity)

        @functools.wraps(func)
        def wrapper(*args):
            result = cache.get(args, None)
            if result is None:
                result = func(*args)
                cache.put(args, result)
            return result

        wrapper.cache = cache
        return wrapper

    return decorator
