"""`SizedLRU`: the engine's one LRU map bounded by its values' sizes (bytes) or by their count.

Least recently used entries are evicted first, each through `on_evict`; entries a caller says to `keep`
(adapters in use, pristine copies of dirty weights) are never evicted, so the map may run over its bound
while they fill it. Not thread-safe: each owner holds its own lock.
Hand-written, not a cachetools `LRUCache`: that one evicts inside `__setitem__` until the new value fits
and refuses one that cannot, so it cannot keep entries that must stay past its bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["SizedLRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _one(_key: object, _value: object) -> int:
    return 1


class SizedLRU(Generic[K, V]):
    """A map of at most `maxsize` (the sum of `sizeof(key, value)`; 1 each when not given: a count), LRU-evicted.

    `maxsize=None` never evicts. Each entry's size is taken once, when it is put.
    """

    def __init__(
        self,
        maxsize: int | None,
        sizeof: Callable[[K, V], int] = _one,
        on_evict: Callable[[K, V, int], None] | None = None,
    ) -> None:
        self.maxsize = maxsize
        self._sizeof = sizeof
        self._on_evict = on_evict
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._size = 0

    @property
    def currsize(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        """Keys, least recently used first."""
        return iter(self._items)

    def sizeof(self, key: K, value: V) -> int:
        return self._sizeof(key, value)

    def size_of(self, key: K) -> int:
        """The size `key`'s entry was counted at (0 when absent)."""
        item = self._items.get(key)
        return item[1] if item is not None else 0

    def peek(self, key: K) -> V | None:
        """The value for `key`, leaving its recency as it is."""
        item = self._items.get(key)
        return item[0] if item is not None else None

    def get(self, key: K) -> V | None:
        """The value for `key`, now the most recently used."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def touch(self, keys: Iterable[K]) -> None:
        """Mark `keys` (those present) most recently used, in the order given."""
        for key in keys:
            if key in self._items:
                self._items.move_to_end(key)

    def put(self, key: K, value: V, keep: Collection[K] = ()) -> int:
        """Store `value` as most recently used after evicting to make room for it (never `key` or `keep`);
        returns its size."""
        size = self._sizeof(key, value)
        old = self.size_of(key)
        self.pop(key)
        # Room for both: the old value may still be referenced by a caller while the new one is put.
        self.trim(size + old, keep)
        self._items[key] = (value, size)
        self._size += size
        return size

    def pop(self, key: K) -> V | None:
        """Remove `key`'s entry without calling `on_evict`; its value, or None when absent."""
        item = self._items.pop(key, None)
        if item is None:
            return None
        self._size -= item[1]
        return item[0]

    def trim(self, room: int = 0, keep: Collection[K] = ()) -> None:
        """Evict least recently used entries outside `keep` until `room` more fits (or only kept ones are left)."""
        if self.maxsize is None or self._size + room <= self.maxsize:
            return
        for key in list(self._items):
            if self._size + room <= self.maxsize:
                return
            if key in keep:
                continue
            value, size = self._items.pop(key)
            self._size -= size
            if self._on_evict is not None:
                self._on_evict(key, value, size)
