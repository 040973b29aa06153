"""Which layer updates keep their ΔW from preparation instead of recomputing it at every swap.

LoHa and DoRA layers keep theirs (a recomputed LoHa ΔW costs up to 11x a plain LoRA's swap); LoKr keeps its
factors. A kept ΔW costs 4 bytes per weight value it touches, so it comes out of a budget (a share of the host
cache on the CPU, none on a GPU), all of an adapter's layers or none, so its cached bytes are known before it is
stored. The measurements behind the choice: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from engine.formats.dora import DoraUpdate
from engine.formats.layers import LayerDelta, LayerUpdate, Scratch
from engine.formats.lycoris import LohaFactors

__all__ = ["keep_deltas"]


def keep_deltas(layers: Sequence[LayerUpdate], params: Sequence[torch.Tensor], budget: int) -> list[LayerUpdate]:
    """`layers` with the ΔW of their LoHa and DoRA layers computed now in float32, if all of them fit `budget`."""
    chosen = [layer for layer in layers if _worth_keeping(layer)]
    need = sum(params[layer.target].numel() * 4 for layer in chosen)
    if not chosen or need > budget:
        return list(layers)
    scratch = Scratch()
    return [
        _kept(layer, tuple(params[layer.target].shape), scratch) if _worth_keeping(layer) else layer for layer in layers
    ]


def _worth_keeping(layer: LayerUpdate) -> bool:
    return isinstance(layer, LohaFactors | DoraUpdate)


def _kept(layer: LayerUpdate, shape: tuple[int, ...], scratch: Scratch) -> LayerUpdate:
    if isinstance(layer, DoraUpdate):
        # The rescale needs the base and the request's scale: only the LoRA part inside is kept.
        return dataclasses.replace(layer, inner=_delta(layer.inner, shape, scratch))
    return _delta(layer, shape, scratch)


def _delta(layer: LayerUpdate, shape: tuple[int, ...], scratch: Scratch) -> LayerDelta:
    """The layer's scaled ΔW, computed once in float32 on its factors' device."""
    device = layer.tensors[0].device
    acc = torch.zeros(shape[0], math.prod(shape[1:]), dtype=torch.float32, device=device)
    layer.add_to(acc, 1.0, scratch)
    return LayerDelta(layer.target, acc)
