"""Which layer updates keep their ΔW from preparation instead of recomputing it at every swap.

LoHa and DoRA layers keep theirs (a recomputed LoHa ΔW costs up to 11x a plain LoRA's swap); LoKr keeps its
factors. A kept ΔW costs 4 bytes per weight value it touches, so it comes out of a budget (a share of the host
cache on the CPU, none on a GPU), all of an adapter's layers or none, so its cached bytes are known before it is
stored. The measurements behind the choice: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import torch

from engine.formats.dora import DoraUpdate
from engine.formats.layers import LayerDelta, LayerUpdate, Scratch
from engine.formats.lycoris import LohaFactors

__all__ = ["keep_deltas", "may_keep_delta"]

# Names only LoHa factors and DoRA magnitudes have (PEFT's and kohya's): a file without them keeps no ΔW.
_KEPT_NAMES = ("hada_w1_a", "lora_magnitude_vector", "dora_scale")


def keep_deltas(layers: Sequence[LayerUpdate], shapes: Sequence[tuple[int, ...]], budget: int) -> list[LayerUpdate]:
    """`layers` with the ΔW of their LoHa and DoRA layers computed now in float32, if all of them fit `budget`
    (`shapes`: each target weight's, `TargetTable.shapes`)."""
    chosen = [layer for layer in layers if _worth_keeping(layer)]
    need = sum(math.prod(shapes[layer.target]) * 4 for layer in chosen)
    if not chosen or need > budget:
        return list(layers)
    scratch = Scratch()
    return [_kept(layer, tuple(shapes[layer.target]), scratch) if _worth_keeping(layer) else layer for layer in layers]


def may_keep_delta(names: Iterable[str]) -> bool:
    """Whether a file with these tensor names (its header's) has layers whose ΔW `keep_deltas` may keep."""
    return any(part in name for name in names for part in _KEPT_NAMES)


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
