"""The swap: fuse a set of prepared adapters into the base weights, and take it out again exactly.

Taking a set out never subtracts: every weight a set touched is copied back from
a pristine copy made the first time that weight was touched, so the base is
bit-exact after any number of swaps. Putting a set in is one `addmm_` per layer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .adapters import PreparedAdapter

__all__ = ["ActiveAdapter", "WeightPatcher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveAdapter:
    """An adapter on the compute device, with the scale the request asked for."""

    adapter: PreparedAdapter
    scale: float


class WeightPatcher:
    """Owns the pristine copies and knows which weights currently differ from them."""

    def __init__(self, params: Sequence[torch.Tensor], pristine_device: torch.device) -> None:
        self._params = list(params)
        self._pristine_device = pristine_device
        self._pristine: dict[int, torch.Tensor] = {}
        self._dirty: set[int] = set()

    @property
    def dirty(self) -> frozenset[int]:
        return frozenset(self._dirty)

    @property
    def pristine_bytes(self) -> int:
        return sum(t.nbytes for t in self._pristine.values())

    @torch.no_grad()
    def apply(self, active: Sequence[ActiveAdapter]) -> None:
        """Make the weights equal base + the given set, whatever set was fused before.

        On failure the touched weights are restored to base before the error propagates,
        so the caller can re-apply what it served before.
        """
        touched = {layer.target for item in active for layer in item.adapter.layers}
        try:
            for index in sorted(touched - self._pristine.keys()):
                self._pristine[index] = self._snapshot(self._params[index])
            self._restore(self._dirty)
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
        self._pristine = {i: t for i, t in self._pristine.items() if i in keep}

    @staticmethod
    def _fuse(weight: torch.Tensor, up: torch.Tensor, down: torch.Tensor, alpha: float) -> None:
        if up.dtype != weight.dtype or up.device != weight.device:
            # Per-call (ZeroGPU) mode keeps no device copies: factors come from pinned host memory.
            up = up.to(device=weight.device, dtype=weight.dtype, non_blocking=True)
            down = down.to(device=weight.device, dtype=weight.dtype, non_blocking=True)
        if weight.is_contiguous():
            weight.view(weight.shape[0], -1).addmm_(up, down, alpha=alpha)
        else:
            # channels_last convolution weights cannot be viewed as a matrix
            weight.add_(torch.mm(up, down).view(weight.shape), alpha=alpha)

    def _restore(self, indices: set[int]) -> None:
        for index in sorted(indices):
            self._params[index].copy_(self._pristine[index], non_blocking=True)

    def _snapshot(self, weight: torch.Tensor) -> torch.Tensor:
        copy = weight.detach().to(self._pristine_device, copy=True)
        if self._pristine_device.type == "cpu" and weight.device.type == "cuda":
            copy = copy.pin_memory()
        return copy
