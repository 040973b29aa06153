"""`SizedLRU`: the one LRU the adapter store, the pristine copies and the worker cache share."""

from __future__ import annotations

from engine.caches.lru import SizedLRU


def _bytes(_key: str, value: bytes) -> int:
    return len(value)


def test_counted_lru_evicts_the_least_recently_used_through_the_hook():
    evicted: list[tuple[str, int, int]] = []
    lru: SizedLRU[str, int] = SizedLRU(2, on_evict=lambda k, v, size: evicted.append((k, v, size)))
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # now b is the least recently used
    lru.put("c", 3)
    assert list(lru) == ["a", "c"] and evicted == [("b", 2, 1)]
    assert lru.peek("a") == 1 and list(lru) == ["a", "c"]  # peek leaves the order alone


def test_byte_bounded_lru_makes_room_and_counts_each_entry_once():
    evicted: list[str] = []
    lru: SizedLRU[str, bytes] = SizedLRU(10, _bytes, lambda k, v, size: evicted.append(k))
    for key in "abc":
        lru.put(key, b"xxx")
    assert lru.currsize == 9
    lru.put("d", b"xxxxx")  # needs 5: a and b go, oldest first
    assert evicted == ["a", "b"] and list(lru) == ["c", "d"] and lru.currsize == 8
    assert lru.size_of("d") == 5 and lru.size_of("a") == 0


def test_kept_entries_are_never_evicted_even_past_the_bound():
    evicted: list[str] = []
    lru: SizedLRU[str, bytes] = SizedLRU(6, _bytes, lambda k, v, size: evicted.append(k))
    lru.put("a", b"xxx")
    lru.put("b", b"xxx")
    lru.put("c", b"xxx", keep={"a"})
    assert evicted == ["b"] and list(lru) == ["a", "c"]
    lru.put("d", b"xxx", keep={"a", "c"})  # nothing evictable: over the bound while the kept ones fill it
    assert evicted == ["b"] and lru.currsize == 9
    lru.trim(keep={"c"})
    assert evicted == ["b", "a"] and lru.currsize == 6


def test_pop_does_not_call_the_hook_and_none_never_evicts():
    evicted: list[str] = []
    lru: SizedLRU[str, bytes] = SizedLRU(None, _bytes, lambda k, v, size: evicted.append(k))
    for key in "abcdefgh":
        lru.put(key, b"x" * 100)
    assert len(lru) == 8 and lru.pop("a") == b"x" * 100 and lru.pop("a") is None
    lru.touch(["b", "zz"])
    assert list(lru)[-1] == "b" and evicted == [] and lru.currsize == 700
