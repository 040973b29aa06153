"""A real-width slice of the Qwen-Image transformer, its LoRA files, and diffusers' pipeline around it.

Qwen-Image's transformer is 3072 wide with 60 dual-stream blocks (20.4 B parameters, 41 GB in bf16). The slice
keeps every width and layer of the real one (Qwen/Qwen-Image's transformer/config.json: 24 heads of 128, the
3584-wide Qwen2.5-VL input) with 3 blocks: 1.05 B parameters, 2.1 GB in bf16. Its random weights are cut from
one pool (`bench.sdxl_unet.fill_module`), so every tensor can be regenerated and compared bit for bit.

The LoRAs adapt every Linear layer of those blocks as musubi-tuner and ai-toolkit train Qwen-Image (both streams'
attention projections, MLPs and modulations), written in kohya/musubi names with `.alpha` and in diffusers'
names with their `lora_adapter_metadata`: the engine converts both with diffusers' own converter, as it would a
Hub file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

from engine.families.tiny_qwen_image import build_tiny_pipeline

from . import slices
from .ours import LoraPair
from .sdxl_unet import random_pool

__all__ = [
    "QWEN_POOL_SIZE",
    "QWEN_SLICE_CONFIG",
    "build_qwen_slice",
    "qwen_pool",
    "qwen_targets",
    "reference_qwen_pipeline",
    "write_qwen_pair",
]

# Qwen/Qwen-Image's transformer/config.json, cut to 3 blocks.
QWEN_SLICE_CONFIG: dict[str, Any] = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 3,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}
# Larger than the slice's largest tensor (a block's modulation, 3072 x 18432 = 56.6M values).
QWEN_POOL_SIZE = 1 << 26
# Every Linear layer of a block, as musubi-tuner's and ai-toolkit's Qwen-Image LoRAs adapt them.
_BLOCK_LAYERS = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
    "img_mod.1",
    "txt_mod.1",
)
# musubi-tuner's names: the diffusers module's, underscored.
_LORA = slices.SliceLora("qwen", kohya_stem=slices.unet_stem, kohya_metadata=slices.kohya_base("qwen_image"))


def qwen_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, QWEN_POOL_SIZE)


def build_qwen_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> QwenImageTransformer2DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return slices.build_slice(
        QwenImageTransformer2DModel, QWEN_SLICE_CONFIG, config, dtype=dtype, device=device, pool=pool
    )


def qwen_targets(transformer: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(module, in features, out features) of every Linear layer of the slice's blocks."""
    return slices.block_targets(transformer, "transformer_blocks", _BLOCK_LAYERS)


def write_qwen_pair(folder: Path, targets: Sequence[tuple[str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two Qwen-Image LoRA files of `rank` in `fmt` ("kohya": musubi-tuner's `lora_unet_` names with `.alpha`;
    "peft": diffusers' names with their `lora_adapter_metadata`), float16, as trainers save them."""
    return slices.write_slice_pair(folder, targets, _LORA, rank=rank, fmt=fmt)


def reference_qwen_pipeline(transformer: QwenImageTransformer2DModel) -> QwenImagePipeline:
    """A Qwen-Image pipeline around the slice; its other parts are tiny, since the LoRAs only touch the
    transformer."""
    return slices.reference_pipeline(QwenImagePipeline, build_tiny_pipeline(), transformer)
