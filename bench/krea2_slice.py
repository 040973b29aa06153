"""A real-width slice of the Krea 2 transformer, its LoRA files, and diffusers' pipeline around it.

Krea 2's transformer is 6144 wide with 28 single-stream blocks (12.8 B parameters, 25.6 GB in bf16). The slice keeps
every width and layer of the real one (diffusers' Krea2Transformer2DModel defaults: 48 query heads of 128 over 12
key/value heads, the 16384-wide SwiGLU MLP, the shared 6144 x 36864 modulation, the text-fusion stage) with 2
blocks: 1.53 B parameters, 3.1 GB in bf16. Its random weights are cut from one pool (`bench.sdxl_unet.fill_module`),
so every tensor can be regenerated and compared bit for bit.

The LoRAs adapt every Linear layer of those blocks as ai-toolkit trains Krea 2 (the attention's q, k, v, output and
gate, the MLP's gate, up and down), written in kohya's names with `.alpha` (which diffusers' converter refuses: the
engine renames them, `engine.families.krea2_names`) and in diffusers' names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import Krea2Pipeline, Krea2Transformer2DModel

from engine.families.krea2_tiny import build_tiny_pipeline

from . import slices
from .ours import LoraPair
from .sdxl_unet import random_pool

__all__ = [
    "KREA2_POOL_SIZE",
    "KREA2_SLICE_CONFIG",
    "build_krea2_slice",
    "krea2_pool",
    "krea2_targets",
    "reference_krea2_pipeline",
    "write_krea2_pair",
]

# Krea2Transformer2DModel's defaults (Krea 2's transformer/config.json), cut to 2 blocks.
KREA2_SLICE_CONFIG: dict[str, Any] = {"num_layers": 2}
# Larger than the slice's largest tensor (the shared modulation, 6144 x 36864 = 226.5M values).
KREA2_POOL_SIZE = 1 << 28
# Every Linear layer of a block, in diffusers' names and in the original model's (kohya's, underscored).
_BLOCK_LAYERS = {
    "attn.to_q": "attn_wq",
    "attn.to_k": "attn_wk",
    "attn.to_v": "attn_wv",
    "attn.to_out.0": "attn_wo",
    "attn.to_gate": "attn_gate",
    "ff.gate": "mlp_gate",
    "ff.up": "mlp_up",
    "ff.down": "mlp_down",
}
# kohya's names are the original model's (`lora_unet_blocks_N_attn_wq`); ai-toolkit's diffusers-named files carry no
# `lora_adapter_metadata`.
_LORA = slices.SliceLora(
    "krea2",
    kohya_stem=lambda module: slices.unet_stem(slices.original_name(module, _BLOCK_LAYERS)),
    kohya_metadata=slices.kohya_base("krea2"),
    peft_metadata=False,
)


def krea2_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, KREA2_POOL_SIZE)


def build_krea2_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> Krea2Transformer2DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return slices.build_slice(
        Krea2Transformer2DModel, KREA2_SLICE_CONFIG, config, dtype=dtype, device=device, pool=pool
    )


def krea2_targets(transformer: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(module, in features, out features) of every Linear layer of the slice's blocks."""
    return slices.block_targets(transformer, "transformer_blocks", _BLOCK_LAYERS)


def write_krea2_pair(folder: Path, targets: Sequence[tuple[str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two Krea 2 LoRA files of `rank` in `fmt` ("kohya": `lora_unet_` names with `.alpha`; "peft": diffusers'
    names), float16, as trainers save them."""
    return slices.write_slice_pair(folder, targets, _LORA, rank=rank, fmt=fmt)


def reference_krea2_pipeline(transformer: Krea2Transformer2DModel) -> Krea2Pipeline:
    """A Krea 2 pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    tiny = build_tiny_pipeline()
    return slices.reference_pipeline(
        Krea2Pipeline, tiny, transformer, text_encoder_select_layers=tiny.text_encoder_select_layers, is_distilled=True
    )
