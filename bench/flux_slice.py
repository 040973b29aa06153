"""A real-width slice of the FLUX.1 transformer, its LoRA files, and diffusers' pipeline around it.

FLUX.1's transformer is 3072 wide with 19 double and 38 single blocks (12 B parameters, 24 GB in bf16): too
much for a 24 GiB machine with pristine copies and diffusers' reference beside it. The slice keeps every
width and layer of the real one (FLUX.1 [dev]'s config: guidance embedding, 4096-wide T5 input, 768-wide
CLIP input) with 2 double and 4 single blocks: 1.31 B parameters, 2.4 GiB in bf16. Its random weights are cut
from one pool (`bench.sdxl_unet.fill_module`), so every tensor can be regenerated and compared bit for bit.

The LoRAs adapt every layer of those blocks as kohya's sd-scripts trains FLUX (`serving.demo.synthetic_flux`:
BFL's fused qkv and linear1, projections, MLPs, modulations), written in kohya names and as their diffusers
twins: the engine converts both with diffusers' own converter at real width, as it would a Hub file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel

from engine.families.flux import build_tiny_pipeline
from serving.demo.synthetic import kohya_metadata, save_lora
from serving.demo.synthetic_flux import FluxLayer, flux_layers, make_flux_lora

from . import slices
from .ours import LoraPair
from .sdxl_unet import random_pool

__all__ = [
    "FLUX_POOL_SIZE",
    "FLUX_SLICE_CONFIG",
    "build_flux_slice",
    "flux_pool",
    "flux_targets",
    "reference_flux_pipeline",
    "write_flux_pair",
]

# FLUX.1 [dev]'s transformer/config.json, cut to 2 double and 4 single blocks.
FLUX_SLICE_CONFIG: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 2,
    "num_single_layers": 4,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
# Larger than the slice's largest tensor (a single block's proj_out, 3072 x 15360 = 47.2M values).
FLUX_POOL_SIZE = 1 << 26


def flux_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, FLUX_POOL_SIZE)


def build_flux_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> FluxTransformer2DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return slices.build_slice(FluxTransformer2DModel, FLUX_SLICE_CONFIG, config, dtype=dtype, device=device, pool=pool)


def flux_targets(transformer: torch.nn.Module) -> list[FluxLayer]:
    """Every BFL layer of the slice's blocks: what a kohya FLUX LoRA adapts."""
    return flux_layers(transformer)


def write_flux_pair(folder: Path, layers: Sequence[FluxLayer], *, rank: int, fmt: str) -> LoraPair:
    """Two FLUX LoRA files of `rank` in `fmt` ("kohya": BFL names with `.alpha`; "peft": diffusers' names with
    their `lora_adapter_metadata`), float16, as trainers save them."""
    if fmt not in slices.FORMATS:
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: {', '.join(slices.FORMATS)}")
    paths = []
    for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2)):
        lora = make_flux_lora(layers, rank=rank, seed=seed, alpha=float(rank), dtype=torch.float16)
        tensors, metadata = lora.file(fmt)  # type: ignore[arg-type]
        if fmt == "kohya":
            metadata = kohya_metadata(dim=rank, alpha=float(rank), base_version="flux1")
        paths.append(save_lora(folder / f"flux-r{rank}-{fmt}-{name}.safetensors", tensors, metadata))
    return LoraPair(rank, fmt, (paths[0], paths[1]))


def reference_flux_pipeline(transformer: FluxTransformer2DModel) -> FluxPipeline:
    """A FLUX pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    return slices.reference_pipeline(FluxPipeline, build_tiny_pipeline(), transformer)
