import pytest

from cachetools_lite import LRUCache, memoize


def test_get_and_put():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing", 0) == 0


def test_hit_and_miss_counters():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.hits, cache.misses) == (1, 1)


def test_update_existing_key_keeps_others():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("b", 20)
    assert "a" in cache
    assert cache.get("b") == 20


def test_rejects_zero_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_memoize_calls_once():
    calls = []

    @memoize(capacity=4)
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9
    assert square(3) == 9
    assert calls == [3]
