"""The swap: fuse a set of prepared adapters into the base weights, and take it out again exactly.

Taking a set out never subtracts: every weight a set touched is copied back from
a pristine copy made the first time that weight was touched, so the base is
bit-exact after any number of swaps. Putting a set in is one `addmm_` per layer.

Pristine copies live inside a byte budget: copies of weights that are clean (not
fused right now) are dropped least recently used first to make room, and a set
whose touched weights alone need more than the budget is refused before anything
changes. A dropped copy is simply taken again, from the clean weight, the next
time a set touches that weight.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .adapters import PreparedAdapter
from .errors import LimitExceededError

__all__ = ["ActiveAdapter", "WeightPatcher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveAdapter:
    """An adapter on the compute device, with the scale the request asked for."""

    adapter: PreparedAdapter
    scale: float


class WeightPatcher:
    """Owns the pristine copies and knows which weights currently differ from them.

    `apply` and `restore_all` are called by one thread at a time (the engine's pipeline lock);
    the pristine map is also read by status calls from other threads, so it is only touched under
    `_lock`.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        pristine_device: torch.device,
        *,
        budget: int | None = None,
        pin: bool | None = None,
    ) -> None:
        self._params = list(params)
        self._pristine_device = pristine_device
        self._budget = budget
        # Pinned host copies make restores to the GPU asynchronous; ZeroGPU's main process must never pin.
        self._pin = pin
        self._lock = threading.Lock()
        self._pristine: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._dirty: set[int] = set()

    @property
    def dirty(self) -> frozenset[int]:
        return frozenset(self._dirty)

    @property
    def pristine_bytes(self) -> int:
        with self._lock:
            return self._bytes

    @property
    def pristine_count(self) -> int:
        with self._lock:
            return len(self._pristine)

    @property
    def budget(self) -> int | None:
        return self._budget

    @torch.no_grad()
    def apply(self, active: Sequence[ActiveAdapter]) -> None:
        """Make the weights equal base + the given set, whatever set was fused before.

        A set that cannot fit the pristine budget is refused with nothing changed. On any
        other failure the touched weights are restored to base before the error propagates,
        so the caller can re-apply what it served before.
        """
        touched = {layer.target for item in active for layer in item.adapter.layers}
        self._check_budget(touched, active)
        try:
            self._restore(self._dirty)
            self._dirty = set()
            missing = sorted(touched - self._pristine_keys())
            self._make_room(sum(self._params[i].nbytes for i in missing), keep=touched)
            for index in missing:
                copy = self._snapshot(self._params[index])
                with self._lock:
                    self._pristine[index] = copy
                    self._bytes += copy.nbytes
            with self._lock:
                for index in touched:
                    self._pristine.move_to_end(index)
            self._dirty = set(touched)
            for item in active:
                for layer in item.adapter.layers:
                    self._fuse(self._params[layer.target], layer.up, layer.down, item.scale * layer.scaling)
        except BaseException:
            self.restore_all()
            raise

    @torch.no_grad()
    def restore_all(self) -> None:
        """Put every touched weight back to its pristine value."""
        self._restore(self._dirty)
        self._dirty = set()

    def forget_pristine(self, keep: set[int] | None = None) -> None:
        """Drop pristine copies of weights that are clean (to free memory)."""
        keep = (keep or set()) | self._dirty
        with self._lock:
            for index in [i for i in self._pristine if i not in keep]:
                self._bytes -= self._pristine.pop(index).nbytes

    def _check_budget(self, touched: set[int], active: Sequence[ActiveAdapter]) -> None:
        if self._budget is None:
            return
        need = sum(self._params[i].nbytes for i in touched)
        if need > self._budget:
            names = ", ".join(str(a.adapter.key) for a in active)
            raise LimitExceededError(
                f"the LoRA set [{names}] changes {need / 2**20:.1f} MiB of weights, more than the pristine-copy "
                f"budget of {self._budget / 2**20:.1f} MiB; accepted: sets that touch at most PRISTINE_BYTES"
            )

    def _make_room(self, room: int, keep: set[int]) -> None:
        """Drop least recently used copies of clean weights outside `keep` until `room` more bytes fit."""
        if self._budget is None:
            return
        with self._lock:
            for index in list(self._pristine):
                if self._bytes + room <= self._budget:
                    break
                if index in keep or index in self._dirty:
                    continue
                self._bytes -= self._pristine.pop(index).nbytes
            left = self._bytes
        if room:
            logger.debug("pristine copies: %d bytes kept, %d bytes to add", left, room)

    def _pristine_keys(self) -> set[int]:
        with self._lock:
            return set(self._pristine)

    @staticmethod
    def _fuse(weight: torch.Tensor, up: torch.Tensor, down: torch.Tensor, alpha: float) -> None:
        if up.dtype != weight.dtype or up.device != weight.device:
            # Per-call (ZeroGPU) mode keeps no device copies: factors come from host memory.
            up = up.to(device=weight.device, dtype=weight.dtype, non_blocking=True)
            down = down.to(device=weight.device, dtype=weight.dtype, non_blocking=True)
        if weight.is_contiguous():
            weight.view(weight.shape[0], -1).addmm_(up, down, alpha=alpha)
        else:
            # channels_last convolution weights cannot be viewed as a matrix
            weight.add_(torch.mm(up, down).view(weight.shape), alpha=alpha)

    def _restore(self, indices: set[int]) -> None:
        with self._lock:
            copies = [(i, self._pristine[i]) for i in sorted(indices)]
        for index, copy in copies:
            self._params[index].copy_(copy, non_blocking=True)

    def _snapshot(self, weight: torch.Tensor) -> torch.Tensor:
        copy = weight.detach().to(self._pristine_device, copy=True)
        pin = self._pin if self._pin is not None else weight.device.type == "cuda"
        if self._pristine_device.type == "cpu" and pin:
            copy = copy.pin_memory()
        return copy
