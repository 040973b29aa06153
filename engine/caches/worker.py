"""ZeroGPU: the GPU worker's own prepared-adapter cache, so a call ships adapter keys, not tensors.

On ZeroGPU the `@spaces.GPU` function runs in a worker process forked from the main one; its arguments
are pickled into it and its result pickled back. The worker is kept between calls while the Space holds
the GPU, so it can keep adapters it was sent. The main process keeps only a view: the keys the worker said
it held after its last call (`WorkerView`). A call strips the tensors of adapters in that view (`ship`);
the worker fills them from its cache (`WorkerCache.receive`), or, when it lacks one (it was replaced, or
another GPU's worker answered), answers with the keys it misses and the call is made again with tensors.

Nothing here touches CUDA: the worker cache holds host tensors (device memory does not outlive a call
on ZeroGPU), and the main process never reads them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.caches.store import ByteLRU
from engine.formats.adapters import AdapterKey, PreparedAdapter
from engine.requests import GenerateResult

if TYPE_CHECKING:
    from engine.pools.engine import PreparedRequest

__all__ = ["GpuOutcome", "WorkerCache", "WorkerView"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuOutcome:
    """What the worker answers: the result, or the adapters it lacks; and the keys it holds now."""

    result: GenerateResult | None
    missing: tuple[AdapterKey, ...]
    held: frozenset[AdapterKey]


class WorkerView:
    """The main process's idea of what the worker holds (updated from each outcome)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: frozenset[AdapterKey] = frozenset()

    def ship(self, prepared: PreparedRequest, *, full: bool = False) -> PreparedRequest:
        """`prepared` with the tensors of adapters the worker holds left out (all kept when `full`)."""
        with self._lock:
            held = frozenset() if full else self._held
        adapters = tuple((_stub(a) if a.key in held else a, s, s2) for a, s, s2 in prepared.adapters)
        return dataclasses.replace(prepared, adapters=adapters)

    def learn(self, outcome: GpuOutcome) -> None:
        with self._lock:
            self._held = outcome.held

    @property
    def held(self) -> frozenset[AdapterKey]:
        with self._lock:
            return self._held


class WorkerCache:
    """Adapters the worker was sent, LRU-bounded in bytes; used only inside the GPU worker."""

    def __init__(self, budget: int) -> None:
        self._lock = threading.Lock()
        # The worker's adapters live on its GPU: its device tier.
        self._lru = ByteLRU("device", budget)

    def receive(self, prepared: PreparedRequest) -> PreparedRequest | tuple[AdapterKey, ...]:
        """`prepared` with every adapter's tensors filled in, or the keys this worker lacks."""
        keys = {a.key for a, *_ in prepared.adapters}
        filled, missing = [], []
        with self._lock:
            for adapter, scale, scale_2 in prepared.adapters:
                if adapter.layers:
                    if adapter.nbytes <= self._lru.budget:
                        self._lru.put(adapter.key, adapter, keep=keys)
                    filled.append((adapter, scale, scale_2))
                elif (cached := self._lru.get(adapter.key)) is not None:
                    filled.append((cached, scale, scale_2))
                else:
                    missing.append(adapter.key)
        if missing:
            logger.info("GPU worker lacks %s: asking for the tensors", ", ".join(map(str, missing)))
            return tuple(missing)
        return dataclasses.replace(prepared, adapters=tuple(filled))

    def held(self) -> frozenset[AdapterKey]:
        with self._lock:
            return frozenset(self._lru.ordered_keys())

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._lru.nbytes


def _stub(adapter: PreparedAdapter) -> PreparedAdapter:
    # Same key, file size and warnings; no tensors (a few hundred bytes pickled).
    return dataclasses.replace(adapter, layers=(), embeddings=None)
