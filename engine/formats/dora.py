"""DoRA: the base weight plus a LoRA-type ΔW, rescaled to a learned magnitude, as PEFT merges it.

`W' = m / ‖W0 + s·ΔW‖ · (W0 + s·ΔW)`, the norm per output row (PEFT's `lora_magnitude_vector`) or, for
LyCORIS files whose `dora_scale` lies on the input axis, per input column: the axis is read from the shape,
as LyCORIS's loader does. The request's scale multiplies ΔW, as in PEFT. Several adapters on one weight each
add `(f - 1)·W0 + f·s·ΔW` with `f` computed from the base, as PEFT's unmerged forward pass does, independent
of their order. Sources, line by line: docs/internals.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from engine.errors import IncompatibleLoraError
from engine.formats.layers import TMP3, LayerUpdate, Mapper, Scratch, as_float32

__all__ = ["DoraUpdate", "dora_update"]


@dataclass(frozen=True)
class DoraUpdate:
    """A LoRA-type update (`inner`) whose result is rescaled to `magnitude` along `on_output`'s axis."""

    target: int
    inner: LayerUpdate
    magnitude: torch.Tensor  # flat: (out,) when on_output, else (in,)
    on_output: bool
    needs_base: ClassVar[bool] = True

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.inner.tensors, self.magnitude)

    def map(self, fn: Mapper) -> DoraUpdate:
        return DoraUpdate(self.target, self.inner.map(fn), fn(self.magnitude), self.on_output)

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        raise TypeError("a DoRA update needs the base weight: `engine.formats.layers.fuse` calls `rescale`")

    def rescale(
        self, acc: torch.Tensor, base: torch.Tensor, alpha: float, scratch: Scratch, *, acc_is_base: bool
    ) -> None:
        """`acc += (f - 1)·W0 + f·alpha·ΔW`; when `acc` still equals W0 that is `acc = f·(W0 + alpha·ΔW)`."""
        if acc_is_base:
            self.inner.add_to(acc, alpha, scratch)
            self._normalise(acc)
            return
        merged = scratch.get(TMP3, acc.shape, acc.device)
        merged.view(base.shape).copy_(base)
        self.inner.add_to(merged, alpha, scratch)
        self._normalise(merged)
        acc.add_(merged.sub_(base.reshape(acc.shape)))

    def _normalise(self, merged: torch.Tensor) -> None:
        """`merged *= m / ‖merged‖` along the magnitude's axis; `merged` is (out, in · kernel)."""
        magnitude = as_float32(self.magnitude, merged.device)
        # A row that is all zeros stays zeros (PEFT would divide 0 by 0); every other norm is used as is.
        tiny = torch.finfo(torch.float32).tiny
        if self.on_output:
            norm = torch.linalg.vector_norm(merged, dim=1, keepdim=True)
            merged.mul_(magnitude.view(-1, 1) / norm.clamp_min_(tiny))
        else:
            columns = merged.view(merged.shape[0], magnitude.numel(), -1)
            norm = torch.linalg.vector_norm(columns, dim=(0, 2), keepdim=True)
            columns.mul_(magnitude.view(1, -1, 1) / norm.clamp_min_(tiny))


def dora_update(
    inner: LayerUpdate, magnitude: torch.Tensor, weight_shape: tuple[int, ...], *, peft: bool, where: str
) -> DoraUpdate:
    """Wrap `inner` with a DoRA magnitude, its axis read from the shape (PEFT's is always the output axis)."""
    out_ch, in_ch = weight_shape[0], weight_shape[1]
    shape = tuple(magnitude.shape)
    numel = magnitude.numel()
    if peft or (shape and shape[0] == out_ch and numel == out_ch):
        on_output = True
        fits = numel == out_ch
    else:
        on_output = False
        fits = numel == in_ch and len(shape) >= 2 and shape[0] == 1 and shape[1] == in_ch
    if not fits:
        raise IncompatibleLoraError(
            f"{where}: a DoRA magnitude of shape {shape} fits neither axis of a weight of shape {weight_shape}"
        )
    return DoraUpdate(inner.target, inner, magnitude.reshape(-1), on_output)
