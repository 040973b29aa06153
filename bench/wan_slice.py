"""A real-width slice of Wan's 14B video transformer, and its LoRA files.

Wan 2.1 T2V-14B's transformer (and each of Wan 2.2 A14B's two) is 5120 wide with 40 blocks (14.3 B parameters,
28.6 GB in bf16). The slice keeps every width and layer of the real one (diffusers' `WanTransformer3DModel`
defaults are the 14B's config: 40 heads of 128, the 13824-wide feed-forward, UMT5's 4096-wide text input) with 2
blocks: 0.95 B parameters. Its random weights are cut from one pool (`bench.sdxl_unet.fill_module`), so every
tensor can be regenerated and compared bit for bit.

The LoRAs adapt every Linear layer of those blocks as musubi-tuner and ai-toolkit train Wan (self- and
cross-attention q, k, v, o and the feed-forward), written in musubi-tuner's `lora_unet_` names (Wan's original
module names) with `.alpha`, and in diffusers' names with their `lora_adapter_metadata`: the engine converts both
with diffusers' own converter (`WanPipeline.lora_state_dict`), as it would a Hub file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import WanPipeline, WanTransformer3DModel

from engine.families.tiny_wan import build_tiny_pipeline

from . import slices
from .ours import LoraPair
from .sdxl_unet import random_pool

__all__ = [
    "WAN_POOL_SIZE",
    "WAN_SLICE_CONFIG",
    "build_wan_slice",
    "reference_wan_pipeline",
    "wan_pool",
    "wan_targets",
    "write_wan_pair",
]

# Wan-AI/Wan2.1-T2V-14B-Diffusers' transformer/config.json (diffusers' defaults), cut to 2 blocks.
WAN_SLICE_CONFIG: dict[str, Any] = {"num_layers": 2}
# Larger than the slice's largest tensor (the time projection, 5120 x 30720 = 157M values).
WAN_POOL_SIZE = 1 << 28
# (diffusers' module, Wan's original name as musubi-tuner writes it) for every Linear layer of a block.
_BLOCK_LAYERS = (
    ("attn1.to_q", "self_attn.q"),
    ("attn1.to_k", "self_attn.k"),
    ("attn1.to_v", "self_attn.v"),
    ("attn1.to_out.0", "self_attn.o"),
    ("attn2.to_q", "cross_attn.q"),
    ("attn2.to_k", "cross_attn.k"),
    ("attn2.to_v", "cross_attn.v"),
    ("attn2.to_out.0", "cross_attn.o"),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
)


def wan_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, WAN_POOL_SIZE)


def build_wan_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> WanTransformer3DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return slices.build_slice(WanTransformer3DModel, WAN_SLICE_CONFIG, config, dtype=dtype, device=device, pool=pool)


def wan_targets(transformer: torch.nn.Module) -> list[tuple[str, str, int, int]]:
    """(diffusers' module, Wan's name, in features, out features) of every Linear layer of the slice's blocks."""
    originals = dict(_BLOCK_LAYERS)
    return [
        (module, slices.original_name(module, originals), fan_in, fan_out)
        for module, fan_in, fan_out in slices.block_targets(transformer, "blocks", originals)
    ]


def write_wan_pair(folder: Path, targets: Sequence[tuple[str, str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two Wan LoRA files of `rank` in `fmt` ("kohya": musubi-tuner's `lora_unet_` names with `.alpha`; "peft":
    diffusers' names with their `lora_adapter_metadata`), float16, as trainers save them."""
    originals = {module: original for module, original, _, _ in targets}
    lora = slices.SliceLora(
        "wan", kohya_stem=lambda module: slices.unet_stem(originals[module]), kohya_metadata=slices.kohya_base("wan")
    )
    modules = [(module, fan_in, fan_out) for module, _, fan_in, fan_out in targets]
    return slices.write_slice_pair(folder, modules, lora, rank=rank, fmt=fmt)


def reference_wan_pipeline(transformer: WanTransformer3DModel) -> WanPipeline:
    """A Wan pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    return slices.reference_pipeline(WanPipeline, build_tiny_pipeline(), transformer)
