"""Chroma LoRA files for the tiny Chroma pipeline, in every naming diffusers' Chroma loader (`FluxLoraLoaderMixin`)
reads, and the one it ignores: diffusers/PEFT (with Chroma's modulation network, `distilled_guidance_layer`),
kohya's `lora_unet_` and ComfyUI's `diffusion_model.` over BFL's fused qkv/linear1 (with and without `linear1`),
kohya's diffusers-named `lora_transformer_` (the attention diffusers places), and BFL's names with
`lora_A`/`lora_B` (with ComfyUI's prefix and without, with and without `.alpha`), which diffusers' loader silently
ignores, and with PEFT's `base_model.model.` (fal's), on which diffusers' converter raises for Chroma. Each has its
diffusers-named twin, the reference diffusers loads where it cannot read the file itself (a kohya `linear1` at the
tiny widths, BFL names with `lora_A`/`lora_B`).

FLUX.1 LoRAs made on the tiny FLUX.1 pipeline (the same 32 wide, as the real ones share 3072) for the cross cases:
one with FLUX.1's modulations, which Chroma lacks, and one over the attention only, which tensors cannot tell."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import DOUBLE, FluxLayer, flux_layers, make_flux_lora
from tests.support.flux import bfl_named

ChromaFormat = Literal["peft", "kohya", "comfy", "bfl", "bfl_bare", "fal", "kohya_diffusers"]

# BFL's layers a Chroma block has: FLUX.1's without their modulations (`img_mod`, `txt_mod`, `modulation`).
CHROMA_DOUBLE = tuple(name for name in DOUBLE if not name.endswith("_mod.lin"))
CHROMA_SINGLE = ("linear1", "linear2")
WITHOUT_LINEAR1 = ("linear2",)
# Chroma's own modulation network (diffusers' names), which diffusers reads in its own naming only.
GUIDANCE = (
    "distilled_guidance_layer.in_proj",
    "distilled_guidance_layer.layers.0.linear_1",
    "distilled_guidance_layer.layers.1.linear_2",
    "distilled_guidance_layer.out_proj",
)
# The layer a LoRA made for a wider Chroma is refused on (the first it names).
WIDE_MODULE = "transformer_blocks.0.attn.to_q"
# FLUX.1's attention, the layers a FLUX.1 LoRA shares with Chroma.
ATTENTION = ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj")


@dataclass(frozen=True)
class ChromaCase:
    """One Chroma LoRA file: how it is made, and what diffusers' reference loads for it."""

    name: str
    fmt: ChromaFormat
    linear1: bool = True
    guidance: bool = False
    alpha: float | None = 2.0
    seed: int = 1

    @property
    def file_name(self) -> str:
        return f"chroma_{self.name}.safetensors"

    @property
    def twin_name(self) -> str:
        return f"chroma_{self.name}_twin.safetensors"

    @property
    def reference_name(self) -> str:
        """diffusers reads a kohya/ComfyUI `linear1` only at real widths, and ignores BFL names with `lora_A`:
        there the twin stands in for the file."""
        reads = self.fmt in ("peft", "kohya_diffusers") or (self.fmt in ("kohya", "comfy") and not self.linear1)
        return self.file_name if reads else self.twin_name


CASES = (
    ChromaCase("peft", "peft", guidance=True, seed=61),
    ChromaCase("kohya", "kohya", linear1=False, seed=62),
    ChromaCase("kohya_linear1", "kohya", seed=63),
    ChromaCase("comfy", "comfy", linear1=False, alpha=None, seed=64),
    ChromaCase("comfy_linear1", "comfy", seed=65),
    ChromaCase("bfl", "bfl", alpha=None, seed=66),
    ChromaCase("bfl_bare", "bfl_bare", seed=67),
    ChromaCase("fal", "fal", alpha=None, seed=69),
    ChromaCase("kohya_diffusers", "kohya_diffusers", seed=70),
)


def _guidance_layers(transformer: torch.nn.Module) -> list[FluxLayer]:
    layers = []
    for module in GUIDANCE:
        linear = transformer.get_submodule(module)
        part = f"transformer.{module}"
        layers.append(FluxLayer(module, (part,), (int(linear.out_features),), int(linear.in_features)))
    return layers


def chroma_file(transformer: torch.nn.Module, case: ChromaCase) -> tuple[dict, dict[str, str], dict]:
    """The case's tensors and metadata, and its twin's tensors."""
    single = CHROMA_SINGLE if case.linear1 else WITHOUT_LINEAR1
    layers = flux_layers(transformer, double=CHROMA_DOUBLE, single=single)
    if case.guidance:
        layers += _guidance_layers(transformer)
    lora = make_flux_lora(layers, rank=4, seed=case.seed, strength=1.0, alpha=case.alpha)
    if case.fmt in ("peft", "kohya", "comfy"):
        tensors, metadata = lora.file(case.fmt)
        return tensors, metadata, lora.twin()
    if case.fmt == "kohya_diffusers":
        twin = {k: v for k, v in lora.twin().items() if _placed_by_kohya_diffusers(k)}
        return kohya_diffusers_named(twin), {"format": "pt"}, twin
    assert case.fmt in ("bfl", "bfl_bare", "fal")
    comfy, metadata = lora.file("comfy")
    tensors = bfl_named(comfy, case.fmt, alphas=case.alpha is not None)
    return tensors, metadata, lora.twin()


def _placed_by_kohya_diffusers(name: str) -> bool:
    """Whether diffusers' reading of kohya's diffusers-named form places the layer: the blocks' attention and the
    top-level embedders and output (it names any other layer of a block as the block itself)."""
    module = name.removeprefix("transformer.")
    return ".attn." in module or module.startswith(("proj_out.", "x_embedder.", "context_embedder."))


def kohya_diffusers_named(twin: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers-named twin in kohya's diffusers-named form (`lora_transformer_<module>`, `lora_down`/`lora_up`,
    each `.alpha` its rank: the twin's scale is in its up factors); diffusers' FLUX converter calls it a mixture."""
    tensors = {}
    for name, tensor in twin.items():
        module, _, factor = name.removeprefix("transformer.").rpartition(".lora_")
        stem = "lora_transformer_" + module.replace(".", "_")
        if factor == "A.weight":
            tensors[f"{stem}.lora_down.weight"] = tensor
            tensors[f"{stem}.alpha"] = torch.tensor(float(tensor.shape[0]))
        else:
            tensors[f"{stem}.lora_up.weight"] = tensor
    return tensors


def write_chroma_loras(pipe, folder: Path, *, cases=CASES) -> dict[str, ChromaCase]:
    """Each case's file and its twin in `folder` (rank 4), by case name."""
    for case in cases:
        tensors, metadata, twin = chroma_file(pipe.transformer, case)
        save_lora(folder / case.file_name, tensors, metadata)
        save_lora(folder / case.twin_name, twin)
    return {case.name: case for case in cases}


def write_flux_loras_for_chroma(flux_pipe, folder: Path) -> tuple[str, str]:
    """Two FLUX.1 LoRAs (kohya's names, made on the tiny FLUX.1 transformer): one adapting FLUX.1's modulations too
    (`img_mod`, `txt_mod`, `modulation`: layers Chroma lacks), one its attention only; their file names."""
    full = flux_layers(flux_pipe.transformer)
    attention = flux_layers(flux_pipe.transformer, double=ATTENTION, single=("linear2",))
    names = ("flux1_with_modulations.safetensors", "flux1_attention.safetensors")
    for name, layers, seed in zip(names, (full, attention), (71, 72), strict=True):
        tensors, metadata = make_flux_lora(layers, rank=4, seed=seed, strength=1.0, alpha=2.0).file("kohya")
        save_lora(folder / name, tensors, metadata)
    return names
