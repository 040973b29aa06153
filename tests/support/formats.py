"""Shared by the LoHa/LoKr/DoRA tests: the tiny pipeline's adaptable parts, and loading a file as the engine does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from engine.formats.adapters import AdapterKey, PreparedAdapter, prepare
from engine.formats.targets import TargetTable
from lora_catalog.sft_header import read_header
from serving.demo.synthetic import TEXT_ATTENTION, UNET_ATTENTION_FF_CONV

COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
PATTERNS = {"unet": UNET_ATTENTION_FF_CONV, "text_encoder": TEXT_ATTENTION, "text_encoder_2": TEXT_ATTENTION}


def components(pipe) -> dict[str, nn.Module]:
    return {c: getattr(pipe, c) for c in COMPONENTS}


def load(path: Path, table: TargetTable, *, delta_budget: int = 0) -> PreparedAdapter:
    """What the engine does with a new file: read its header, then prepare it against `table`."""
    header = read_header(path)
    key = AdapterKey("test", path.stem, "0" * 40, path.name)
    shapes = {name: info.shape for name, info in header.tensors.items()}
    return prepare(
        path,
        key,
        table,
        max_rank=64,
        metadata=header.metadata,
        shapes=shapes,
        delta_budget=delta_budget,
    )


def spec_table(spec: Any, pipe: Any) -> TargetTable:
    """The target table the engine builds for `spec`'s family over `pipe` (its components, denoiser, converter,
    full differences and LyCORIS naming)."""
    return TargetTable(
        {c: getattr(pipe, c) for c in spec.components},
        denoiser=spec.denoiser,
        convert_lora=spec.convert_lora,
        full_differences=spec.full_differences,
        lycoris_modules=spec.lycoris_modules,
        unapplied_parts=spec.unapplied_parts,
    )
