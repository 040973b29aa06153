"""FLUX LoRA files for the tiny FLUX pipeline, in every naming diffusers reads, each with the file a reference
loads: the file itself where diffusers reads it at the tiny widths, else its diffusers-named twin. And BFL's names
with `lora_A`/`lora_B` (`BFL_CASES`, with ComfyUI's prefix and without, with and without `.alpha`), which
diffusers' loader silently ignores: their reference is always the twin."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import FluxFormat, flux_layers, make_flux_lora

# Every BFL layer but a single block's fused `linear1`, whose kohya split diffusers makes at FLUX.1's widths only.
WITHOUT_LINEAR1 = ("linear2", "modulation.lin")
XLABS_DOUBLE = ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj")


# BFL's names with PEFT's factor names: `bfl` with ComfyUI's `diffusion_model.` prefix, `bfl_bare` without, `fal`
# with PEFT's `base_model.model.` (fal's trainer: PEFT's state dict of BFL's model).
BflFormat = Literal["bfl", "bfl_bare", "fal"]


def bfl_named(comfy: dict[str, torch.Tensor], fmt: BflFormat, *, alphas: bool) -> dict[str, torch.Tensor]:
    """A ComfyUI-named file's tensors in BFL's names with `lora_A`/`lora_B` (the flow trainer's, ai-toolkit's
    Chroma files); `alphas` False drops each `.alpha` (PEFT's reading then: a scale of 1)."""
    tensors = {}
    for name, tensor in comfy.items():
        if name.endswith(".alpha") and not alphas:
            continue
        name = name.replace(".lora_down.weight", ".lora_A.weight").replace(".lora_up.weight", ".lora_B.weight")
        bare = name.removeprefix("diffusion_model.")
        tensors[{"bfl": name, "bfl_bare": bare, "fal": f"base_model.model.{bare}"}[fmt]] = tensor
    return tensors


@dataclass(frozen=True)
class FluxCase:
    """One FLUX LoRA file: how it is made, and what diffusers' reference loads for it."""

    name: str
    fmt: FluxFormat | BflFormat
    text: bool = True
    linear1: bool = True
    sparse: bool = False
    alpha: float | None = 2.0
    seed: int = 1

    @property
    def file_name(self) -> str:
        return f"flux_{self.name}.safetensors"

    @property
    def twin_name(self) -> str:
        return f"flux_{self.name}_twin.safetensors"

    @property
    def reference_name(self) -> str:
        """diffusers reads a kohya/ComfyUI `linear1` only at FLUX.1's real widths: the twin stands in for it."""
        if self.fmt in ("bfl", "bfl_bare", "fal"):
            return self.twin_name  # diffusers' loader ignores these names (fal's: its converter needs FLUX.1's widths)
        return self.twin_name if self.linear1 and self.fmt in ("kohya", "comfy") else self.file_name


CASES = (
    FluxCase("peft", "peft", seed=11),
    FluxCase("kohya", "kohya", linear1=False, seed=12),
    FluxCase("kohya_linear1", "kohya", seed=13),
    FluxCase("kohya_sparse", "kohya", sparse=True, alpha=None, seed=14),
    FluxCase("comfy", "comfy", linear1=False, seed=15),
    FluxCase("comfy_linear1", "comfy", text=False, seed=16),
    FluxCase("xlabs", "xlabs", text=False, alpha=None, seed=17),
)
# BFL's names with `lora_A`/`lora_B` over the transformer (BFL's trainers adapt no CLIP), with `linear1`.
BFL_CASES = (
    FluxCase("bfl", "bfl", text=False, alpha=None, seed=18),
    FluxCase("bfl_bare", "bfl_bare", text=False, seed=19),
)
# fal's trainer's: BFL's names under PEFT's `base_model.model.` (diffusers reads them with its fal/Kontext
# converter, which needs a whole FLUX.1 [dev] at its real widths; ours reads them as the names above).
FAL_CASE = FluxCase("fal", "fal", text=False, alpha=None, seed=20)


def write_flux_loras(pipe, folder: Path, *, strength: float = 1.0, cases=CASES) -> dict[str, FluxCase]:
    """Each case's file and its twin in `folder` (rank 4), by case name."""
    for case in cases:
        if case.fmt == "xlabs":
            layers = flux_layers(pipe.transformer, double=XLABS_DOUBLE, single=("qkv",))
        else:
            single = ("linear1", *WITHOUT_LINEAR1) if case.linear1 else WITHOUT_LINEAR1
            layers = flux_layers(pipe.transformer, pipe.text_encoder if case.text else None, single=single)
        lora = make_flux_lora(layers, rank=4, seed=case.seed, strength=strength, alpha=case.alpha, sparse=case.sparse)
        if case.fmt in ("bfl", "bfl_bare", "fal"):
            comfy, metadata = lora.file("comfy")
            tensors = bfl_named(comfy, case.fmt, alphas=case.alpha is not None)
        else:
            tensors, metadata = lora.file(case.fmt)
        save_lora(folder / case.file_name, tensors, metadata)
        save_lora(folder / case.twin_name, lora.twin())
    return {case.name: case for case in cases}


def assert_same_updates(ours: dict[str, torch.Tensor], twin: dict[str, torch.Tensor]) -> None:
    """Two diffusers-named LoRA state dicts make the same update per layer (`lora_B @ lora_A`): diffusers' kohya
    converter puts a layer's alpha / rank on its down factor, a twin written in diffusers' names on its up factor."""
    assert ours.keys() == twin.keys()
    for down in (k for k in ours if k.endswith(".lora_A.weight")):
        up = down.replace(".lora_A.", ".lora_B.")
        assert torch.allclose(ours[up] @ ours[down], twin[up] @ twin[down], rtol=1e-5, atol=1e-7), down
