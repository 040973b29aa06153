"""The swap: fuse a set of prepared adapters into the base weights, and take it out again exactly.

Taking a set out never subtracts: every weight a set touched is copied back from
a pristine copy made the first time that weight was touched, so the base is
bit-exact after any number of swaps. Putting a set in writes each touched weight
once, from its pristine value plus every update on it summed in float32
(`engine.layers.fuse`: one `addmm_` per plain LoRA layer, rounded once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .adapters import PreparedAdapter
from .layers import LayerUpdate, Scratch, fuse

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
        self._scratch = Scratch()

    @property
    def dirty(self) -> frozenset[int]:
        return frozenset(self._dirty)

    @property
    def pristine_bytes(self) -> int:
        return sum(t.nbytes for t in self._pristine.values())

    @property
    def scratch_bytes(self) -> int:
        """float32 work buffers kept between swaps (about one largest touched weight, or a few with LyCORIS/DoRA)."""
        return self._scratch.nbytes

    @torch.no_grad()
    def apply(self, active: Sequence[ActiveAdapter]) -> None:
        """Make the weights equal base + the given set, whatever set was fused before.

        On failure the touched weights are restored to base before the error propagates,
        so the caller can re-apply what it served before.
        """
        plan: dict[int, list[tuple[LayerUpdate, float]]] = {}
        for item in active:
            for layer in item.adapter.layers:
                plan.setdefault(layer.target, []).append((layer, item.scale))
        try:
            for index in sorted(plan.keys() - self._pristine.keys()):
                self._pristine[index] = self._snapshot(self._params[index])
            stale = self._dirty - plan.keys()
            self._dirty |= plan.keys()
            self._restore(stale)
            self._dirty = set(plan)
            for index in sorted(plan):
                weight, pristine = self._params[index], self._pristine[index]
                if pristine.device != weight.device:
                    # Pristine copies kept in host memory: restore first, then the weight itself is the base.
                    weight.copy_(pristine, non_blocking=True)
                    pristine = weight
                fuse(weight, pristine, plan[index], self._scratch)
        except BaseException:
            self.restore_all()
            raise

    @torch.no_grad()
    def restore_all(self) -> None:
        """Put every touched weight back to its pristine value."""
        self._restore(self._dirty)
        self._dirty = set()

    def pristine_copies(self, indices: Iterable[int]) -> dict[int, torch.Tensor]:
        """The pristine copies of weights already touched, by index (shared, not copied: never write to them)."""
        return {index: self._pristine[index] for index in indices}

    def forget_pristine(self, keep: set[int] | None = None) -> None:
        """Drop pristine copies of weights that are clean (to free memory)."""
        keep = (keep or set()) | self._dirty
        self._pristine = {i: t for i, t in self._pristine.items() if i in keep}
        self._scratch.clear()

    def _restore(self, indices: set[int]) -> None:
        for index in sorted(indices):
            self._params[index].copy_(self._pristine[index], non_blocking=True)

    def _snapshot(self, weight: torch.Tensor) -> torch.Tensor:
        copy = weight.detach().to(self._pristine_device, copy=True)
        if self._pristine_device.type == "cpu" and weight.device.type == "cuda":
            copy = copy.pin_memory()
        return copy
