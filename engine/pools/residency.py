"""Which pools' pipelines are on the compute device, and moving them in and out.

When the pools do not all fit the plan's room, the least recently used idle pipeline waits in host RAM and is
moved in on demand; a pool in use is never moved, and a pool that fits nothing is refused when added, so a lone
pool is never evicted. A pool on the device costs its weights plus its pristine copies there (dropped when it
leaves). Each move is one copy of the pool's flat buffer (`engine.pools.flat`), Parameters kept, every byte as
it was. On the CPU there is no budget unless one is given (tests and benchmarks exercise the move so).
Hand-written, not `engine.caches.lru`: evicting here moves a pipeline or waits for one to idle, never drops a value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from engine.devices import same_device
from engine.errors import GpuUnavailableError, SettingsError
from engine.outcomes import PoolMemory
from engine.pools.flat import FlatWeights, module_bytes, module_tensors

__all__ = ["PoolMemory", "Residency", "module_bytes"]

logger = logging.getLogger(__name__)


@dataclass
class _Slot:
    # Mutable bookkeeping, touched only under Residency._cond.
    name: str
    weights: FlatWeights
    # What its pristine copies may take on the device while it is there (0 when they live in host RAM).
    pristine: int
    before_leaving: Callable[[], None]
    resident: bool
    users: int = 0
    last_used: float = 0.0
    moves_in: int = 0
    last_move_s: float = 0.0

    @property
    def nbytes(self) -> int:
        """What the pool holds on the device while it is there."""
        return self.weights.nbytes + self.pristine


class Residency:
    """LRU residency of pool pipelines on one device, bounded by `budget` bytes (None: no bound)."""

    def __init__(self, device: torch.device, budget: int | None) -> None:
        self._device = device
        self._budget = budget
        # Host buffers are pinned only for a CUDA device (ZeroGPU's main process never moves a pool: no budget).
        self._pin = device.type == "cuda"
        self._slots: dict[str, _Slot] = {}
        self._cond = threading.Condition()

    @property
    def budget(self) -> int | None:
        return self._budget

    def add(
        self, name: str, modules: list[nn.Module], *, before_leaving: Callable[[], None], pristine: int = 0
    ) -> bool:
        """Register a pool (in host RAM or on the device) and place it by the budget; True if resident.

        `pristine`: the bytes its pristine copies may take on the device while it is there. A pool that could
        never be placed, even alone, is refused here (at start-up), rather than failing every request later.
        """
        weights = FlatWeights(modules, pin=self._pin)
        # `cuda` (the setting) and `cuda:0` (a tensor's) are one device: with `==` a pool loaded on the GPU would look
        # absent and be copied in a second time (engine.devices).
        on_device = all(same_device(t.device, self._device) for t in module_tensors(modules))
        with self._cond:
            slot = _Slot(name, weights, pristine, before_leaving, resident=on_device)
            if self._budget is not None and slot.nbytes > self._budget:
                raise SettingsError(
                    f"pool {name} needs {_gib(slot.nbytes)} on the device ({_gib(weights.nbytes)} of weights, "
                    f"{_gib(pristine)} for pristine copies) and the device has {_gib(self._budget)} for pipelines; "
                    "accepted: a pool that fits alone (see the memory plan at start-up)"
                )
            fits = self._free() >= slot.nbytes
            self._slots[name] = slot
            # A pool loaded in host RAM that does not fit yet stays in the tensors it was loaded in: packing it
            # into its flat host buffer now would hold it twice in host RAM for a while. Its first move in copies
            # tensor by tensor; from its first move out on, every move is one copy.
            if not on_device and fits:
                self._move_in(slot)
            elif on_device and not fits:
                self._move_out(slot)
            return slot.resident

    @contextmanager
    def use(self, name: str) -> Iterator[float]:
        """Hold pool `name` on the device for the block; yields the seconds spent moving it in (0 when resident)."""
        with self._cond:
            slot = self._slots[name]
            moved_s = 0.0
            while not slot.resident:
                if self._free() >= slot.nbytes:
                    moved_s = self._move_in(slot)
                    break
                victim = self._victim(slot)
                if victim is not None:
                    self._move_out(victim)
                elif not any(s.resident and s.users for s in self._slots.values()):
                    # Cannot happen: `add` refuses a pool that does not fit alone.
                    raise SettingsError(
                        f"pool {name} needs {_gib(slot.nbytes)} but the device has {_gib(self._budget or 0)} for "
                        "pipelines; accepted: a pool that fits alone"
                    )
                else:
                    logger.info("pool %s waits for a busy pool to free the device", name)
                    self._cond.wait()
            slot.users += 1
            slot.last_used = time.monotonic()
        try:
            yield moved_s
        finally:
            with self._cond:
                slot.users -= 1
                self._cond.notify_all()

    def snapshot(self) -> tuple[PoolMemory, ...]:
        with self._cond:
            return tuple(
                PoolMemory(s.name, s.weights.nbytes, s.resident, s.users, s.moves_in, s.last_move_s)
                for s in self._slots.values()
            )

    def _free(self) -> int:
        if self._budget is None:
            return 1 << 62
        return self._budget - sum(s.nbytes for s in self._slots.values() if s.resident)

    def _victim(self, wanted: _Slot) -> _Slot | None:
        idle = [s for s in self._slots.values() if s.resident and not s.users and s is not wanted]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def _move_in(self, slot: _Slot) -> float:
        started = time.perf_counter()
        try:
            moved = slot.weights.to_device(self._device)
        except torch.OutOfMemoryError as e:
            # The pool stays where it was, whole: its tensors are pointed at the new buffer only once every copy
            # is done (engine.pools.flat), so an allocation that fails leaves them in host RAM.
            if self._device.type == "cuda":
                torch.cuda.empty_cache()
            raise GpuUnavailableError(
                f"pool {slot.name} could not be moved onto {self._device}: it is out of memory; try again shortly"
            ) from e
        slot.resident = True
        slot.moves_in += 1
        slot.last_move_s = time.perf_counter() - started
        logger.info("pool %s moved in: %s in %.3f s", slot.name, _gib(moved), slot.last_move_s)
        return slot.last_move_s

    def _move_out(self, slot: _Slot) -> None:
        started = time.perf_counter()
        # The base weights go back first, so what waits in host RAM is the pristine pipeline.
        slot.before_leaving()
        moved = slot.weights.to_host()
        slot.resident = False
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        logger.info(
            "pool %s moved out to host RAM (least recently used): %s in %.3f s",
            slot.name,
            _gib(moved),
            time.perf_counter() - started,
        )


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
