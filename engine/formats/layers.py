"""What a prepared adapter changes in one weight, and how a swap puts it there: in float32, rounded once.

Every kind of update adds `alpha · ΔW` to a float32 accumulator that starts as the base weight;
`fuse` then writes the accumulator into the weight once. A bfloat16 or float16 weight is therefore
rounded exactly once however many adapters touch it, and the factors are read in float32 at the
precision the file holds (casting them to bfloat16 first, as a plain `addmm_` on the weight would,
rounds the factors, the product and the sum). Plain LoRA is one `addmm_` on the accumulator; the
other kinds (LyCORIS in `engine.formats.lycoris`, DoRA in `engine.formats.dora`, a precomputed ΔW here) bring their
own ΔW. An update that needs the base weight itself (DoRA's norm) says so with `needs_base`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, Self, cast

import torch

__all__ = ["LayerDelta", "LayerFactors", "LayerUpdate", "Scratch", "as_float32", "factors_in_float32", "fuse"]

Mapper = Callable[[torch.Tensor], torch.Tensor]

# Scratch slots: the accumulator, two temporaries for the updates' own products, the saved base, a swap's factors.
ACC, TMP1, TMP2, TMP3, BASE, FACTORS = range(6)


class Scratch:
    """float32 work buffers reused across layers and swaps, one per slot and device.

    Allocating a weight-sized buffer per layer costs page faults on the CPU (measured: a fresh
    6.5 MB buffer per 1280x1280 layer adds about a third to the fuse); each slot grows to the
    largest weight it has served and stays.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, torch.device], torch.Tensor] = {}

    def get(self, slot: int, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        buffer = self._buffers.get((slot, device))
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=torch.float32, device=device)
            self._buffers[(slot, device)] = buffer
        return buffer[:numel].view(tuple(shape))

    def clear(self) -> None:
        self._buffers.clear()


def as_float32(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` in float32 on `device` (no copy when it already is; pinned host memory copies asynchronously)."""
    return tensor.to(device=device, dtype=torch.float32, non_blocking=True)


class LayerUpdate(Protocol):
    """One adapter's change to one weight of the `TargetTable` (index `target`)."""

    needs_base: ClassVar[bool]

    @property
    def target(self) -> int: ...

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]: ...

    def map(self, fn: Mapper) -> Self:
        """The same update with every tensor replaced by `fn(tensor)`."""
        ...

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        """`acc += alpha · ΔW`, with `acc` the float32 weight flattened to (out, in · kernel)."""
        ...


@dataclass(frozen=True)
class LayerFactors:
    """Plain LoRA: `ΔW = scaling · up @ down`, both factors flattened to 2-D. The fast path: one `addmm_`."""

    target: int
    down: torch.Tensor
    up: torch.Tensor
    scaling: float
    needs_base: ClassVar[bool] = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.down, self.up)

    def map(self, fn: Mapper) -> LayerFactors:
        return LayerFactors(self.target, fn(self.down), fn(self.up), self.scaling)

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        up, down = as_float32(self.up, acc.device), as_float32(self.down, acc.device)
        acc.addmm_(up, down, alpha=alpha * self.scaling)


@dataclass(frozen=True)
class LayerDelta:
    """A precomputed `ΔW = scaling · delta` (what caching a LyCORIS layer's product at preparation would hold)."""

    target: int
    delta: torch.Tensor
    scaling: float = 1.0
    needs_base: ClassVar[bool] = False

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.delta,)

    def map(self, fn: Mapper) -> LayerDelta:
        return LayerDelta(self.target, fn(self.delta), self.scaling)

    def add_to(self, acc: torch.Tensor, alpha: float, scratch: Scratch) -> None:
        delta = self.delta.to(device=acc.device, non_blocking=True).view(acc.shape)
        acc.add_(delta, alpha=alpha * self.scaling)


def factors_in_float32(
    updates: Sequence[LayerUpdate], device: torch.device, scratch: Scratch
) -> dict[int, LayerUpdate]:
    """The plain LoRA updates among `updates` whose factors are narrower than float32 on `device`, by `id`, with
    those factors cast to float32 in one `torch.cat` into the scratch (a factor shared by several updates, as
    kohya's fused qkv shares its down factor, once); `LayerFactors.add_to` then casts nothing.

    Why one op: cast factor by factor, a FLUX swap makes two small parallel regions per layer besides the three
    big ones; on a loaded machine each region waits for every intra-op thread to be scheduled, so their number,
    not their bytes, cost ours 1.2-1.5x the floor (`bench.swap --family flux`), the floor having none.
    """
    plain = [u for u in updates if isinstance(u, LayerFactors)]
    offsets: dict[tuple, int] = {}
    sources: list[torch.Tensor] = []
    total = 0
    for update in plain:
        for tensor in update.tensors:
            key = _key(tensor)
            if key in offsets or tensor.dtype == torch.float32 or tensor.device != device:
                continue
            offsets[key] = total
            sources.append(tensor.reshape(-1))
            total += tensor.numel()
    if not sources:
        return {}
    flat = scratch.get(FACTORS, (total,), device)
    torch.cat(sources, out=flat)

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        start = offsets.get(_key(tensor))
        return tensor if start is None else flat[start : start + tensor.numel()].view(tensor.shape)

    return {id(update): update.map(cast) for update in plain}


def _key(tensor: torch.Tensor) -> tuple:
    """What identifies a factor's values: where they start, their layout and dtype (so a shared factor is one)."""
    return (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


class BaseDependent(Protocol):
    """An update whose ΔW depends on the base weight (DoRA): it gets the base, and whether `acc` still equals it."""

    def rescale(
        self, acc: torch.Tensor, base: torch.Tensor, alpha: float, scratch: Scratch, *, acc_is_base: bool
    ) -> None: ...


@torch.no_grad()
def fuse(
    weight: torch.Tensor, base: torch.Tensor, updates: Sequence[tuple[LayerUpdate, float]], scratch: Scratch
) -> None:
    """`weight = round(base + Σ alpha · ΔW)`, summed in float32 and rounded into `weight`'s dtype once.

    `base` holds the pristine weight on `weight`'s device; it may be `weight` itself, freshly restored,
    which stays untouched until the single final write. Updates that need the base go first, while the
    accumulator still equals it (their contributions add up, so the order does not change the sum).
    """
    ordered = sorted(updates, key=lambda item: not item[0].needs_base)
    rows = weight.shape[0]
    direct = weight.dtype == torch.float32 and weight.is_contiguous()
    if direct:
        # float32 weights need no rounding step: accumulate in the weight itself, as the plain fuse always did.
        acc = weight.view(rows, -1)
        if base is not weight:
            acc.copy_(base.view(rows, -1))
        elif any(update.needs_base for update, _ in ordered[1:]):
            base = scratch.get(BASE, weight.shape, weight.device).copy_(weight)
    else:
        acc = scratch.get(ACC, (rows, weight.numel() // rows), weight.device)
        acc.view(weight.shape).copy_(base)
    for index, (update, alpha) in enumerate(ordered):
        if update.needs_base:
            cast(BaseDependent, update).rescale(acc, base, alpha, scratch, acc_is_base=index == 0)
        else:
            update.add_to(acc, alpha, scratch)
    if not direct:
        weight.copy_(acc.view(weight.shape))
