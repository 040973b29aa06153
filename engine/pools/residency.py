"""Which pools' pipelines are on the compute device, and moving them in and out.

The pools' resident sizes are summed at start against the device's budget. When
they do not all fit, the least recently used idle pipeline waits in host RAM
(pinned, so it comes back at full copy speed) and is moved in on demand; a pool
in use is never moved. On the CPU the "device" is host RAM: there is no budget
and every pool stays resident, unless a budget is given (tests and benchmarks do,
so the move itself is exercised and measured).

Moving is done tensor by tensor with `tensor.data = copy` rather than
`pipeline.to()`: the Parameter objects stay the same (the swap's target table and
pristine copies refer to them), host copies are pinned for fast transfers back,
and a CPU "offload" is a real copy that a test can check bit for bit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import GpuUnavailableError, SettingsError
from engine.outcomes import PoolMemory

__all__ = ["WORKING_BYTES", "PoolMemory", "Residency", "device_budget", "module_bytes", "move_modules"]

# Kept free for inference itself: SDXL at 1024² peaks at about 3-4 GiB of activations in fp16.
WORKING_BYTES = 4 * 2**30

logger = logging.getLogger(__name__)


def device_budget(device: torch.device, *, pools: int, adapter_cache_bytes: int, per_call: bool) -> int | None:
    """Bytes the pools' pipelines may hold on `device`; None where there is no bound to keep.

    On the CPU the pipelines live in host RAM anyway, and on ZeroGPU the device is lent per call.
    """
    if device.type != "cuda" or per_call:
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return max(0, total - WORKING_BYTES - pools * adapter_cache_bytes)


def _tensors(modules: Iterator[nn.Module] | list[nn.Module]) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield tensor


def module_bytes(modules: list[nn.Module]) -> int:
    """Bytes of every parameter and buffer of `modules` (shared tensors once)."""
    return sum(t.nbytes for t in _tensors(modules))


@torch.no_grad()
def move_modules(modules: list[nn.Module], device: torch.device) -> int:
    """Copy every parameter and buffer to `device` in place of the old storage; returns the bytes moved."""
    pin = device.type == "cpu" and torch.cuda.is_available()
    moved = 0
    for tensor in _tensors(modules):
        copy = tensor.data.to(device, copy=True, non_blocking=not pin)
        tensor.data = copy.pin_memory() if pin else copy
        moved += tensor.nbytes
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return moved


@dataclass
class _Slot:
    # Mutable bookkeeping, touched only under Residency._cond.
    name: str
    modules: list[nn.Module]
    nbytes: int
    before_leaving: Callable[[], None]
    resident: bool
    users: int = 0
    last_used: float = 0.0
    moves_in: int = 0
    last_move_s: float = 0.0


class Residency:
    """LRU residency of pool pipelines on one device, bounded by `budget` bytes (None: no bound)."""

    def __init__(self, device: torch.device, budget: int | None, *, offload: bool = True) -> None:
        self._device = device
        self._host = torch.device("cpu")
        self._budget = budget
        self._offload = offload
        self._slots: dict[str, _Slot] = {}
        self._cond = threading.Condition()

    @property
    def budget(self) -> int | None:
        return self._budget

    def add(self, name: str, modules: list[nn.Module], *, before_leaving: Callable[[], None]) -> bool:
        """Register a pool (in host RAM or on the device) and place it by the budget; True if resident."""
        nbytes = module_bytes(modules)
        on_device = all(t.device == self._device for t in _tensors(modules))
        with self._cond:
            fits = self._free() >= nbytes
            slot = _Slot(name, modules, nbytes, before_leaving, resident=on_device)
            self._slots[name] = slot
            if not on_device and fits:
                self._move_in(slot)
            elif on_device and not fits:
                self._move_out(slot)
            return slot.resident

    def check(self, sizes: Mapping[str, int]) -> None:
        """Before loading further: with offloading off, fail when the pools do not all fit, naming the numbers."""
        total = sum(sizes.values())
        if self._budget is None or self._offload or total <= self._budget:
            return
        listed = ", ".join(f"{name} {_gib(n)}" for name, n in sizes.items())
        raise SettingsError(
            f"POOL_OFFLOAD=off but the pools need {_gib(total)} ({listed}) and the device has "
            f"{_gib(self._budget)} for them; accepted: fewer or smaller MODELS, or POOL_OFFLOAD=on"
        )

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
                    raise SettingsError(
                        f"pool {name} needs {_gib(slot.nbytes)} but the device budget is {_gib(self._budget or 0)}"
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
                PoolMemory(s.name, s.nbytes, s.resident, s.users, s.moves_in, s.last_move_s)
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
            moved = move_modules(slot.modules, self._device)
        except torch.OutOfMemoryError as e:
            # The pool stays where it was, whole: what had been moved goes back to host RAM.
            for tensor in _tensors(slot.modules):
                if tensor.device != self._host:
                    tensor.data = tensor.data.to(self._host)
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
        moved = move_modules(slot.modules, self._host)
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
