"""Which layer updates keep their ΔW from preparation instead of recomputing it at every swap.

Measured by bench.swap's formats section (full-size SDXL UNet, 140 attention projections, bf16 weights,
2 quiet CPU cores), swap time over the floor (a plain LoRA of the same rank on the same weights), ranks 8 / 32:

- LoHa: recomputed 11.2 / 6.5 (two products and their Hadamard product per swap), kept 0.94 / 0.46;
- DoRA: recomputed 1.57 / 1.21, kept 1.25 / 0.81 (its rescale stays per swap: the norm depends on the scale);
- LoKr: recomputed 0.87 / 0.53, kept 0.90 / 0.63, so it keeps its factors; plain LoRA is the floor itself.

A kept ΔW costs 4 bytes per weight value it touches (19-145x the factors at these ranks), so the engine gives
a budget: a share of the host cache on the CPU, none on a GPU, where the products run on the device at a
fraction of a swap's cost (not measured: no GPU was lent). An adapter keeps the ΔW of all its LoHa and DoRA
layers or of none, so its bytes in the cache are known before it is stored.
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
