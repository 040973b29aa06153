"""LyCORIS modules a family names its own way (`FamilySpec.lycoris_modules`): a layer of the original model under
its own name, or a fused layer the served model holds as several (Krea 2's original `attn.qkv` over diffusers'
`to_q`, `to_k`, `to_v`).

A fused layer's LoHa/LoKr/LoCon tensors are read as LyCORIS reads them on the fused weight (its scale by its own
rule, alpha / dim), their ΔW computed once in float32 and split by rows into one precomputed update per served
layer, in the order the family gives. Its factors must make a ΔW of the fused weight's shape (the served layers'
rows stacked, their common input width), else it is refused naming the layers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from engine.errors import IncompatibleLoraError
from engine.formats.layers import LayerDelta, LayerUpdate, Scratch
from engine.formats.lycoris import lycoris_layer
from engine.formats.targets import TargetTable

__all__ = ["family_modules", "split_layers"]


def family_modules(stems: list[str], table: TargetTable) -> dict[str, tuple[int, ...]]:
    """The stems the served family names itself (`TargetTable.family_modules`), each to its targets' indices."""
    found = {}
    for stem in stems:
        targets = table.family_modules(stem)
        if targets is not None:
            found[stem] = targets
    return found


def split_layers(
    targets: tuple[int, ...], params: Mapping[str, torch.Tensor], table: TargetTable, *, where: str
) -> list[LayerUpdate]:
    """One LyCORIS module's update of `targets` (one layer, or a fused layer's parts, rows stacked in order)."""
    alpha = float(params["alpha"].item()) if "alpha" in params else None
    shapes = [table.shapes[t] for t in targets]
    if len(targets) == 1:
        return [lycoris_layer(targets[0], params, shapes[0], alpha=alpha, rank=None, peft=False, where=where)]
    names = ", ".join(table.names[t] for t in targets)
    if any(shape[1:] != shapes[0][1:] for shape in shapes):
        raise IncompatibleLoraError(f"{where}: the fused layers {names} take different inputs")
    fused = (sum(shape[0] for shape in shapes), *shapes[0][1:])
    layer = lycoris_layer(targets[0], params, fused, alpha=alpha, rank=None, peft=False, where=f"{where} ({names})")
    delta = torch.zeros(fused[0], math.prod(fused[1:]), dtype=torch.float32)
    layer.add_to(delta, 1.0, Scratch())
    rows = torch.split(delta, [shape[0] for shape in shapes])
    return [LayerDelta(target, part.contiguous()) for target, part in zip(targets, rows, strict=True)]
