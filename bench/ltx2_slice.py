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

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel

from engine.families.tiny_ltx2 import build_tiny_pipeline
from serving.demo.synthetic import save_lora

from .ours import LoraPair
from .sdxl_unet import build_filled, random_pool

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


def ltx2_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, LTX2_POOL_SIZE)


def build_ltx2_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> LTX2VideoTransformer3DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    chosen = config if config is not None else LTX2_SLICE_CONFIG
    return build_filled(LTX2VideoTransformer3DModel, chosen, dtype=dtype, device=device, pool=pool)


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
    if fmt not in ("peft", "kohya"):
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: peft, kohya")
    prefix = "diffusion_model" if fmt == "kohya" else "transformer"
    paths = []
    for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2)):
        generator = torch.Generator().manual_seed(seed)
        tensors: dict[str, torch.Tensor] = {}
        for module, fan_in, fan_out in targets:
            down = torch.randn((rank, fan_in), generator=generator) / fan_in**0.5
            up = torch.randn((fan_out, rank), generator=generator) * (0.3 / rank**0.5)
            tensors[f"{prefix}.{module}.lora_A.weight"] = down.to(torch.float16)
            tensors[f"{prefix}.{module}.lora_B.weight"] = up.to(torch.float16)
        path = folder / f"ltx2-r{rank}-{fmt}-{name}.safetensors"
        paths.append(save_lora(path, tensors, _metadata(rank, fmt, targets)))
    return LoraPair(rank, fmt, (paths[0], paths[1]))


def _metadata(rank: int, fmt: str, targets: Sequence[tuple[str, int, int]]) -> dict[str, str]:
    if fmt == "kohya":
        return {"format": "pt", "modelspec.architecture": "ltx-2"}
    config = {
        "transformer.r": rank,
        "transformer.lora_alpha": rank,
        "transformer.rank_pattern": {},
        "transformer.alpha_pattern": {},
        "transformer.target_modules": sorted(module for module, *_ in targets),
    }
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}


def reference_ltx2_pipeline(transformer: LTX2VideoTransformer3DModel) -> LTX2Pipeline:
    """An LTX-2 pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    tiny = build_tiny_pipeline()
    pipe = LTX2Pipeline(**{**tiny.components, "transformer": transformer})
    pipe.set_progress_bar_config(disable=True)
    return pipe
