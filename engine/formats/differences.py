"""Full differences in a LoRA file: a tensor added whole to one parameter at the LoRA's scale, `W + scale·diff`.

ComfyUI's `.diff` (a weight's) and `.diff_b` (a bias'), and the `.diff_m` of kijai's and lightx2v's Wan files (a
block's modulation), as ComfyUI's "diff" weight adapter adds them (`weight += strength · diff`). The simplest delta
the exact swap takes: it keeps the parameter's pristine copy, writes pristine + Σ scale · diff rounded once, and
restores it bit-exactly, as any weight. The served family places each one (`FamilySpec.full_differences`: Wan's
through diffusers' own names); a family that places none refuses them as an unsupported variant, and a difference
it cannot place, or whose shape is not its parameter's, is refused by name. On a quantized pool a difference of a
stored linear's weight is refused (`engine.weights.branches`); the others (norms, biases, modulation, kept in the
compute dtype there) are fused there as here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from engine.errors import IncompatibleLoraError
from engine.formats.layers import LayerDelta, LayerUpdate, Mapper
from engine.formats.targets import TargetTable

__all__ = ["DIFFERENCE", "FullDifference", "difference_layers", "split_differences"]

# A full difference's name: `.diff`, `.diff_b` or `.diff_m` at its end (as `lora_catalog.variants` reads them).
DIFFERENCE = re.compile(r"\.diff(_b|_m)?$")


@dataclass(frozen=True)
class FullDifference(LayerDelta):
    """A full difference on one parameter (`scaling` 1: the LoRA's scale alone multiplies it, as ComfyUI's)."""

    def map(self, fn: Mapper) -> FullDifference:
        return FullDifference(self.target, fn(self.delta), self.scaling)


def split_differences(
    tensors: Mapping[str, torch.Tensor], table: TargetTable
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the full differences, the rest) where the served family places them; else (none, all of them)."""
    if table.full_differences is None:
        return {}, dict(tensors)
    differences = {name: t for name, t in tensors.items() if DIFFERENCE.search(name)}
    return differences, {name: t for name, t in tensors.items() if name not in differences}


def difference_layers(differences: Mapping[str, torch.Tensor], table: TargetTable, label: str) -> list[LayerUpdate]:
    """One `FullDifference` per (tensor, parameter it is placed on), each checked to fit; the unplaced, the
    parameters the served pipeline lacks and the shapes that do not fit are refused, naming them."""
    if not differences or table.full_differences is None:
        return []
    placed = table.full_differences(list(differences))
    unplaced = sorted(name for name in differences if not placed.get(name))
    if unplaced:
        raise IncompatibleLoraError(
            f"{label} has full differences in names the served family does not place: {_named(unplaced)}; "
            "accepted: `.diff`, `.diff_b` and `.diff_m` in the family's original names (ComfyUI's `diffusion_model.`)"
            " or diffusers' (`transformer.`)"
        )
    layers: list[LayerUpdate] = []
    for name, tensor in sorted(differences.items()):
        for parameter in placed[name]:
            index = table.parameter(parameter)
            if index is None:
                raise IncompatibleLoraError(
                    f"{label}: {name} is a difference of {parameter}, which the served pipeline lacks"
                )
            shape = table.shapes[index]
            if not _fits(tuple(tensor.shape), shape):
                raise IncompatibleLoraError(
                    f"{label}: the full difference {name} {tuple(tensor.shape)} does not fit {parameter} of shape "
                    f"{shape}"
                )
            layers.append(FullDifference(index, tensor.reshape(shape)))
    return layers


def _fits(given: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """The same shape, up to dimensions of 1 (a modulation table stored as (6, dim) for (1, 6, dim))."""
    return [d for d in given if d != 1] == [d for d in shape if d != 1]


def _named(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
