"""A real-width slice of LTX-2's 19B audio-video transformer, and its LoRA files.

LTX-2 19B's transformer is 4096 wide for video (32 heads of 128, a 16384-wide feed-forward) and 2048 for audio (32
heads of 64, 8192), with 48 blocks. The slice keeps every width and layer of the real one (diffusers'
`LTX2VideoTransformer3DModel` defaults are the 19B's config) with 2 blocks: 1.12 B parameters. Its random weights
are cut from one pool (`bench.sdxl_unet.fill_module`), so every tensor can be regenerated and compared bit for bit.

The LoRAs adapt every Linear layer of those blocks (the video and audio self- and cross-attentions, the two
cross-modal attentions and both feed-forwards: 28 a block), written in the LTX trainer's original names
(`diffusion_model.transformer_blocks.N...`, the "kohya" format of the benchmark's command line: the file the
trainer and most Hub LTX-2 LoRAs are) and in diffusers' names with their `lora_adapter_metadata`: the engine
converts both with diffusers' own converter (`LTX2Pipeline.lora_state_dict`), as it would a Hub file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel

from engine.families.tiny_ltx2 import build_tiny_pipeline

from . import slices
from .ours import LoraPair
from .sdxl_unet import random_pool

__all__ = [
    "LTX2_POOL_SIZE",
    "LTX2_SLICE_CONFIG",
    "build_ltx2_slice",
    "ltx2_pool",
    "ltx2_targets",
    "reference_ltx2_pipeline",
    "write_ltx2_pair",
]

# Lightricks/LTX-2's transformer config (diffusers' defaults), cut to 2 blocks.
LTX2_SLICE_CONFIG: dict[str, Any] = {"num_layers": 2}
# Larger than the slice's largest tensor (the time embedding's projection, 4096 x 24576 = 101M values).
LTX2_POOL_SIZE = 1 << 27
# The LTX trainer keeps diffusers' module names and `lora_A`/`lora_B` under `diffusion_model.`, without `.alpha`.
_LORA = slices.SliceLora(
    "ltx2", kohya_stem=None, kohya_metadata=lambda rank: {"format": "pt", "modelspec.architecture": "ltx-2"}
)


def ltx2_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, LTX2_POOL_SIZE)


def build_ltx2_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> LTX2VideoTransformer3DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return slices.build_slice(
        LTX2VideoTransformer3DModel, LTX2_SLICE_CONFIG, config, dtype=dtype, device=device, pool=pool
    )


def ltx2_targets(transformer: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(diffusers' module, in features, out features) of every Linear layer of the slice's blocks."""
    targets = []
    blocks: Any = transformer.transformer_blocks
    for index, block in enumerate(blocks):
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear):
                targets.append(
                    (f"transformer_blocks.{index}.{name}", int(module.in_features), int(module.out_features))
                )
    return targets


def write_ltx2_pair(folder: Path, targets: Sequence[tuple[str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two LTX-2 LoRA files of `rank` in `fmt` ("kohya": the LTX trainer's `diffusion_model.` names; "peft":
    diffusers' names with their `lora_adapter_metadata`), float16, as trainers save them."""
    return slices.write_slice_pair(folder, targets, _LORA, rank=rank, fmt=fmt)


def reference_ltx2_pipeline(transformer: LTX2VideoTransformer3DModel) -> LTX2Pipeline:
    """An LTX-2 pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    return slices.reference_pipeline(LTX2Pipeline, build_tiny_pipeline(), transformer)
