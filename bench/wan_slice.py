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

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import WanPipeline, WanTransformer3DModel

from engine.families.tiny_wan import build_tiny_pipeline
from serving.demo.synthetic import kohya_metadata, save_lora

from .ours import LoraPair
from .sdxl_unet import build_filled, random_pool

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
    chosen = config if config is not None else WAN_SLICE_CONFIG
    return build_filled(WanTransformer3DModel, chosen, dtype=dtype, device=device, pool=pool)


def wan_targets(transformer: torch.nn.Module) -> list[tuple[str, str, int, int]]:
    """(diffusers' module, Wan's name, in features, out features) of every Linear layer of the slice's blocks."""
    targets = []
    for index in range(len(transformer.blocks)):  # type: ignore[arg-type]
        for layer, original in _BLOCK_LAYERS:
            module = transformer.get_submodule(f"blocks.{index}.{layer}")
            fan_in, fan_out = int(module.in_features), int(module.out_features)
            targets.append((f"blocks.{index}.{layer}", f"blocks.{index}.{original}", fan_in, fan_out))
    return targets


def write_wan_pair(folder: Path, targets: Sequence[tuple[str, str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two Wan LoRA files of `rank` in `fmt` ("kohya": musubi-tuner's `lora_unet_` names with `.alpha`; "peft":
    diffusers' names with their `lora_adapter_metadata`), float16, as trainers save them."""
    if fmt not in ("peft", "kohya"):
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: peft, kohya")
    paths = []
    for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2)):
        generator = torch.Generator().manual_seed(seed)
        tensors: dict[str, torch.Tensor] = {}
        for module, original, fan_in, fan_out in targets:
            down = torch.randn((rank, fan_in), generator=generator) / fan_in**0.5
            up = torch.randn((fan_out, rank), generator=generator) * (0.3 / rank**0.5)
            if fmt == "kohya":
                stem = "lora_unet_" + original.replace(".", "_")
                tensors[f"{stem}.lora_down.weight"], tensors[f"{stem}.lora_up.weight"] = down, up
                tensors[f"{stem}.alpha"] = torch.tensor(float(rank))
            else:
                tensors[f"transformer.{module}.lora_A.weight"] = down
                tensors[f"transformer.{module}.lora_B.weight"] = up
        tensors = {k: v.to(torch.float16) for k, v in tensors.items()}
        path = folder / f"wan-r{rank}-{fmt}-{name}.safetensors"
        paths.append(save_lora(path, tensors, _metadata(rank, fmt, targets)))
    return LoraPair(rank, fmt, (paths[0], paths[1]))


def _metadata(rank: int, fmt: str, targets: Sequence[tuple[str, str, int, int]]) -> dict[str, str]:
    if fmt == "kohya":
        return kohya_metadata(dim=rank, alpha=float(rank), base_version="wan")
    config = {
        "transformer.r": rank,
        "transformer.lora_alpha": rank,
        "transformer.rank_pattern": {},
        "transformer.alpha_pattern": {},
        "transformer.target_modules": sorted(module for module, *_ in targets),
    }
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}


def reference_wan_pipeline(transformer: WanTransformer3DModel) -> WanPipeline:
    """A Wan pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    tiny = build_tiny_pipeline()
    pipe = WanPipeline(
        tokenizer=tiny.tokenizer,
        text_encoder=tiny.text_encoder,
        transformer=transformer,
        vae=tiny.vae,
        scheduler=tiny.scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe
