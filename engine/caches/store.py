"""The adapter store: prepared adapters in host RAM and on the compute device, LRU-bounded in bytes.

Like vLLM's adapter manager it evicts before it loads and never evicts what is
in use: the adapters fused right now and those leased by requests in flight.
Disk caching is the Hub cache's job (huggingface_hub), not this module's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch

from engine.caches.lru import SizedLRU
from engine.errors import LimitExceededError
from engine.events import EngineEvents, Tier
from engine.formats.adapters import AdapterKey, PreparedAdapter

__all__ = ["AdapterStore", "ByteLRU", "CachedAdapter"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedAdapter:
    key: AdapterKey
    host_bytes: int
    device_bytes: int
    file_size: int
    active: bool


class ByteLRU(SizedLRU[AdapterKey, PreparedAdapter]):
    """Prepared adapters LRU-bounded by their bytes (`pinned`: counted as pinned); refuses one larger than the
    whole budget, and runs over it only while the adapters kept (in use) fill it."""

    def __init__(self, name: Tier, budget: int, events: EngineEvents | None = None, *, pinned: bool = False) -> None:
        super().__init__(budget, _pinned_size if pinned else _size, self._evicted)
        self.name: Tier = name
        self.budget = budget
        self._events = events

    @property
    def nbytes(self) -> int:
        return self.currsize

    def ordered_keys(self) -> list[AdapterKey]:
        return list(self)

    def put(self, key: AdapterKey, value: PreparedAdapter, keep: Collection[AdapterKey] = ()) -> int:
        size = self.sizeof(key, value)
        if size > self.budget:
            raise LimitExceededError(
                f"LoRA {key} needs {size / 2**20:.1f} MiB, more than the whole {self.name} cache "
                f"({self.budget / 2**20:.1f} MiB); accepted: adapters that fit the cache budget"
            )
        super().put(key, value, keep)
        if self.currsize > self.budget:
            logger.warning(
                "%s cache over budget (%d > %d bytes): the rest is in use and cannot be evicted",
                self.name,
                self.currsize,
                self.budget,
            )
        return size

    def evict(self, key: AdapterKey) -> None:
        size = self.size_of(key)
        if self.pop(key) is not None:
            logger.info(
                "evicted %s from the %s cache on request (%d bytes, %d left)", key, self.name, size, self.currsize
            )

    def _evicted(self, key: AdapterKey, _value: PreparedAdapter, size: int) -> None:
        logger.info("evicted %s from the %s cache (%d bytes, %d left)", key, self.name, size, self.currsize)
        if self._events is not None:
            self._events.evicted(self.name, size)


def _size(_key: AdapterKey, adapter: PreparedAdapter) -> int:
    return adapter.nbytes


def _pinned_size(_key: AdapterKey, adapter: PreparedAdapter) -> int:
    return adapter.pinned_bytes


class AdapterStore:
    """Host tier (file dtype; pinned on CUDA) and device tier (compute device, file dtype)."""

    def __init__(
        self,
        *,
        host_budget: int,
        device_budget: int,
        device: torch.device,
        dtype: torch.dtype,
        use_device_tier: bool,
        pin: bool | None = None,
        events: EngineEvents | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._events = events
        self._device = device
        self._dtype = dtype
        # Pinned host copies make uploads asynchronous; pinning initialises CUDA, which ZeroGPU's main process must not.
        self._pin = device.type == "cuda" if pin is None else pin
        # The host tier's budget counts pinned bytes where it pins (engine.hostmem).
        self._host = ByteLRU("host", host_budget, events, pinned=self._pin)
        self._device_tier = ByteLRU("device", device_budget, events) if use_device_tier else None
        self._leases: Counter[AdapterKey] = Counter()
        self._active: set[AdapterKey] = set()
        # Adapters an outside cache (Ray Serve's multiplexed LRU) let go: evicted as soon as nothing uses them.
        self._unwanted: set[AdapterKey] = set()

    def get(self, key: AdapterKey) -> PreparedAdapter | None:
        with self._lock:
            return self._host.get(key)

    def add(self, adapter: PreparedAdapter) -> PreparedAdapter:
        """Keep a freshly prepared adapter in the host tier and return the kept copy.

        Both tiers keep the file's dtype: the fuse reads the factors in float32, so converting them
        to the compute dtype here would round them before the product (and save no work per swap).
        """
        adapter = adapter.to(torch.device("cpu"), pin=self._pin)
        with self._lock:
            self._unwanted.discard(adapter.key)
            self._host.put(adapter.key, adapter, self._protected())
        return adapter

    def lease(self, keys: Iterable[AdapterKey]) -> None:
        with self._lock:
            self._leases.update(keys)

    def release(self, keys: Iterable[AdapterKey]) -> None:
        with self._lock:
            self._leases.subtract(keys)
            self._leases = +self._leases
            self._trim()

    def forget(self, keys: Iterable[AdapterKey]) -> None:
        """Evict `keys` from both tiers now, or once the requests and the swap that use them let go."""
        with self._lock:
            self._unwanted.update(keys)
            self._trim()

    def set_active(self, keys: Iterable[AdapterKey]) -> None:
        with self._lock:
            self._active = set(keys)
            self._trim()

    def for_compute(self, adapter: PreparedAdapter) -> PreparedAdapter:
        """The adapter on the compute device (in its file dtype), from the device tier when cached."""
        if self._device_tier is None:
            return adapter
        with self._lock:
            cached = self._device_tier.get(adapter.key)
            if cached is None:
                self._device_tier.trim(adapter.nbytes, keep=self._protected())
        if self._events is not None:
            self._events.cache_lookup("device", cached is not None)
        if cached is not None:
            return cached
        moved = adapter.to(self._device)
        with self._lock:
            self._device_tier.put(adapter.key, moved, self._protected())
        return moved

    def snapshot(self) -> list[CachedAdapter]:
        with self._lock:
            tier = self._device_tier
            return [
                CachedAdapter(
                    key=key,
                    host_bytes=self._host.size_of(key),
                    device_bytes=tier.size_of(key) if tier is not None else 0,
                    file_size=item.file_size,
                    active=key in self._active,
                )
                for key in self._host.ordered_keys()
                if (item := self._host.peek(key)) is not None
            ]

    @property
    def host_bytes(self) -> int:
        with self._lock:
            return self._host.nbytes

    @property
    def device_bytes(self) -> int:
        with self._lock:
            return self._device_tier.nbytes if self._device_tier is not None else 0

    def in_use(self) -> set[AdapterKey]:
        """Keys that must stay available: fused right now, or leased by a request being prepared or run."""
        with self._lock:
            return self._protected()

    @property
    def budgets(self) -> tuple[int, int]:
        return self._host.budget, self._device_tier.budget if self._device_tier is not None else 0

    def _protected(self) -> set[AdapterKey]:
        return self._active | set(self._leases)

    def _trim(self) -> None:
        protected = self._protected()
        for key in sorted(self._unwanted - protected, key=str):
            self._unwanted.discard(key)
            for tier in (self._host, self._device_tier):
                if tier is not None:
                    tier.evict(key)
        self._host.trim(keep=protected)
        if self._device_tier is not None:
            self._device_tier.trim(keep=protected)
