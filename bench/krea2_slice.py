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
from serving.demo.synthetic import kohya_metadata, save_lora

from .ours import LoraPair
from .sdxl_unet import build_filled, random_pool

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


def krea2_pool(seed: int = 0) -> torch.Tensor:
    return random_pool(seed, KREA2_POOL_SIZE)


def build_krea2_slice(
    *, dtype: torch.dtype, device: torch.device, pool: torch.Tensor, config: dict[str, Any] | None = None
) -> Krea2Transformer2DModel:
    """The slice (or another `config`), every tensor filled from `pool`."""
    return build_filled(
        Krea2Transformer2DModel,
        config if config is not None else KREA2_SLICE_CONFIG,
        dtype=dtype,
        device=device,
        pool=pool,
    )


def krea2_targets(transformer: torch.nn.Module) -> list[tuple[str, int, int]]:
    """(module, in features, out features) of every Linear layer of the slice's blocks."""
    targets = []
    for index in range(len(transformer.transformer_blocks)):  # type: ignore[arg-type]
        for layer in _BLOCK_LAYERS:
            name = f"transformer_blocks.{index}.{layer}"
            module = transformer.get_submodule(name)
            targets.append((name, int(module.in_features), int(module.out_features)))
    return targets


def _kohya_stem(module: str) -> str:
    _, index, layer = module.split(".", 2)
    return f"lora_unet_blocks_{index}_{_BLOCK_LAYERS[layer]}"


def write_krea2_pair(folder: Path, targets: Sequence[tuple[str, int, int]], *, rank: int, fmt: str) -> LoraPair:
    """Two Krea 2 LoRA files of `rank` in `fmt` ("kohya": `lora_unet_` names with `.alpha`; "peft": diffusers'
    names), float16, as trainers save them."""
    if fmt not in ("peft", "kohya"):
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: peft, kohya")
    paths = []
    for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2)):
        generator = torch.Generator().manual_seed(seed)
        tensors: dict[str, torch.Tensor] = {}
        for module, fan_in, fan_out in targets:
            down = torch.randn((rank, fan_in), generator=generator) / fan_in**0.5
            up = torch.randn((fan_out, rank), generator=generator) * (0.3 / rank**0.5)
            if fmt == "kohya":
                stem = _kohya_stem(module)
                tensors[f"{stem}.lora_down.weight"], tensors[f"{stem}.lora_up.weight"] = down, up
                tensors[f"{stem}.alpha"] = torch.tensor(float(rank))
            else:
                tensors[f"transformer.{module}.lora_A.weight"] = down
                tensors[f"transformer.{module}.lora_B.weight"] = up
        tensors = {k: v.to(torch.float16) for k, v in tensors.items()}
        metadata = kohya_metadata(dim=rank, alpha=float(rank), base_version="krea2") if fmt == "kohya" else None
        paths.append(save_lora(folder / f"krea2-r{rank}-{fmt}-{name}.safetensors", tensors, metadata))
    return LoraPair(rank, fmt, (paths[0], paths[1]))


def reference_krea2_pipeline(transformer: Krea2Transformer2DModel) -> Krea2Pipeline:
    """A Krea 2 pipeline around the slice; its other parts are tiny, since the LoRAs only touch the transformer."""
    tiny = build_tiny_pipeline()
    pipe = Krea2Pipeline(
        scheduler=tiny.scheduler,
        vae=tiny.vae,
        text_encoder=tiny.text_encoder,
        tokenizer=tiny.tokenizer,
        transformer=transformer,
        text_encoder_select_layers=tiny.text_encoder_select_layers,
        is_distilled=True,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe
