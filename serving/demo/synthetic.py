"""Synthetic LoRA files with the names and shapes found in the wild.

The offline demo, the tests and the benchmarks cannot download LoRAs, so they
make them: random low-rank factors for a pipeline's real modules, written in
diffusers/PEFT naming (`unet.<module>.lora_A.weight`) or kohya naming
(`lora_unet_input_blocks_4_1_..._to_q.lora_down.weight` with `.alpha`, the SGM
block names kohya's SDXL trainer writes), with the metadata those tools write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file
from torch import nn

__all__ = [
    "TEXT_ATTENTION",
    "UNET_ATTENTION",
    "UNET_ATTENTION_FF_CONV",
    "KohyaNames",
    "LoraTarget",
    "find_targets",
    "kohya_metadata",
    "make_embeddings",
    "make_lora",
    "peft_metadata",
    "save_lora",
]

Format = Literal["peft", "kohya"]

UNET_ATTENTION = (r"attn[12]\.(to_q|to_k|to_v|to_out\.0)$",)
UNET_ATTENTION_FF_CONV = (*UNET_ATTENTION, r"ff\.net\.(0\.proj|2)$", r"resnets\.\d+\.conv[12]$")
TEXT_ATTENTION = (r"self_attn\.(q_proj|k_proj|v_proj|out_proj)$",)
_KOHYA_PREFIX = {"unet": "lora_unet_", "text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}
# kohya's SD 1.x/2.x trainer works on the diffusers UNet (diffusers block names) and one text encoder (`lora_te_`).
_KOHYA_SD1_PREFIX = {"unet": "lora_unet_", "text_encoder": "lora_te_"}
KohyaNames = Literal["sdxl", "sd1"]


@dataclass(frozen=True)
class LoraTarget:
    """One weight a LoRA adapts: `component` is a pipeline attribute, `module` a path inside it."""

    component: str
    module: str
    weight_shape: tuple[int, ...]

    @property
    def is_conv(self) -> bool:
        return len(self.weight_shape) == 4


def find_targets(components: Mapping[str, nn.Module], patterns: Mapping[str, Sequence[str]]) -> list[LoraTarget]:
    """The Linear/Conv2d modules of each component whose path matches one of its regexes."""
    targets = []
    for component, module in components.items():
        regexes = [re.compile(p) for p in patterns.get(component, ())]
        for name, sub in module.named_modules():
            if isinstance(sub, nn.Linear | nn.Conv2d) and any(r.search(name) for r in regexes):
                targets.append(LoraTarget(component, name, tuple(sub.weight.shape)))
    return targets


def make_lora(
    targets: Sequence[LoraTarget],
    *,
    rank: int,
    seed: int,
    fmt: Format = "peft",
    alpha: float | None = None,
    strength: float = 0.2,
    dtype: torch.dtype = torch.float16,
    layers_per_block: int = 2,
    kohya_names: KohyaNames = "sdxl",
) -> dict[str, torch.Tensor]:
    """Random factors whose product changes each weight by about `strength` of its size."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for target in targets:
        out_ch, in_ch = target.weight_shape[:2]
        kernel = target.weight_shape[2:]
        fan_in = in_ch * (kernel[0] * kernel[1] if kernel else 1)
        down = torch.randn((rank, in_ch, *kernel), generator=generator) / fan_in**0.5
        up = torch.randn((out_ch, rank, *((1, 1) if kernel else ())), generator=generator) * (strength / rank**0.5)
        if fmt == "peft":
            stem = f"{target.component}.{_file_module_name(target)}"
            tensors[f"{stem}.lora_A.weight"] = down.to(dtype)
            tensors[f"{stem}.lora_B.weight"] = up.to(dtype)
        else:
            stem = kohya_key(target, layers_per_block, kohya_names)
            tensors[f"{stem}.lora_down.weight"] = down.to(dtype)
            tensors[f"{stem}.lora_up.weight"] = up.to(dtype)
            tensors[f"{stem}.alpha"] = torch.tensor(float(rank if alpha is None else alpha), dtype=dtype)
    return tensors


def make_embeddings(
    widths: Sequence[int], count: int, *, seed: int, std: float, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Pivotal-tuning rows as diffusers' advanced SDXL script saves them: `clip_l` and `clip_g`, one row per token.

    `widths` are the text encoders' hidden sizes (one for SD 1.x: `clip_l` alone); rows are drawn like the
    script initialises them (random, scaled to the standard deviation `std` of the existing token embeddings).
    """
    generator = torch.Generator().manual_seed(seed)
    rows = {}
    for name, width in zip(("clip_l", "clip_g")[: len(widths)], widths, strict=True):
        rows[name] = (torch.randn(count, width, generator=generator) * std).to(dtype)
    return rows


def _file_module_name(target: LoraTarget) -> str:
    # Published text-encoder LoRAs name CLIP's modules under `text_model.`, which recent
    # transformers flattened away; write what real files hold.
    if target.component.startswith("text_encoder") and not target.module.startswith("text_model."):
        return f"text_model.{target.module}"
    return target.module


def kohya_key(target: LoraTarget, layers_per_block: int = 2, names: KohyaNames = "sdxl") -> str:
    """kohya's name for a module: SGM block numbering for an SDXL UNet, `_` for `.`."""
    name = _file_module_name(target)
    if names == "sd1":
        return _KOHYA_SD1_PREFIX[target.component] + name.replace(".", "_")
    if target.component == "unet":
        name = _sgm_block_name(name, layers_per_block)
    return _KOHYA_PREFIX[target.component] + name.replace(".", "_")


_SGM_RESNET = {
    "conv1": "in_layers.2",
    "conv2": "out_layers.3",
    "time_emb_proj": "emb_layers.1",
    "conv_shortcut": "skip_connection",
}


def _sgm_block_name(name: str, layers_per_block: int) -> str:
    span = layers_per_block + 1
    if m := re.match(r"(.*resnets\.\d+)\.(conv1|conv2|time_emb_proj|conv_shortcut)$", name):
        name = f"{m[1]}.{_SGM_RESNET[m[2]]}"
    if m := re.match(r"down_blocks\.(\d+)\.(attentions|resnets)\.(\d+)\.(.*)", name):
        block, kind, layer, rest = int(m[1]), m[2], int(m[3]), m[4]
        return f"input_blocks.{block * span + layer + 1}.{1 if kind == 'attentions' else 0}.{rest}"
    if m := re.match(r"up_blocks\.(\d+)\.(attentions|resnets)\.(\d+)\.(.*)", name):
        block, kind, layer, rest = int(m[1]), m[2], int(m[3]), m[4]
        return f"output_blocks.{block * span + layer}.{1 if kind == 'attentions' else 0}.{rest}"
    if m := re.match(r"mid_block\.(attentions|resnets)\.(\d+)\.(.*)", name):
        index = 1 if m[1] == "attentions" else 2 * int(m[2])
        return f"middle_block.{index}.{m[3]}"
    return name


def kohya_metadata(*, dim: int, alpha: float, base_version: str = "sdxl_base_v1-0", title: str = "") -> dict[str, str]:
    """The metadata kohya's sd-scripts write into an SDXL LoRA."""
    architecture = {
        "sdxl_base_v1-0": "stable-diffusion-xl-v1-base/lora",
        "sd_v1": "stable-diffusion-v1/lora",
        "sd_v2": "stable-diffusion-v2-512/lora",
    }.get(base_version, f"{base_version}/lora")
    return {
        "ss_network_module": "networks.lora",
        "ss_network_dim": str(dim),
        "ss_network_alpha": str(alpha),
        "ss_base_model_version": base_version,
        "modelspec.architecture": architecture,
        "modelspec.implementation": "https://github.com/Stability-AI/generative-models",
        "modelspec.sai_model_spec": "1.0.0",
        "modelspec.title": title,
    }


def peft_metadata(targets: Sequence[LoraTarget], *, rank: int, alpha: float) -> dict[str, str]:
    """diffusers' `lora_adapter_metadata`: the LoraConfig of each component, JSON-encoded."""
    config: dict[str, object] = {}
    for component in sorted({t.component for t in targets}):
        modules = sorted({t.module for t in targets if t.component == component})
        config.update(
            {f"{component}.r": rank, f"{component}.lora_alpha": alpha, f"{component}.target_modules": modules}
        )
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}


def save_lora(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=dict(metadata or {}))
    return path
