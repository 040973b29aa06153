"""Qwen-Image LoRA files for the tiny Qwen-Image pipeline, in every naming diffusers'
`QwenImageLoraLoaderMixin.lora_state_dict` reads (diffusers 0.42, `_convert_non_diffusers_qwen_lora_to_diffusers`):
diffusers/PEFT (`transformer.` with `lora_A`/`lora_B`, with or without `.alpha`, and PEFT's `lora_A.default.`),
ComfyUI/ai-toolkit (`diffusion_model.` with `lora_A` or `lora_down`), kohya/musubi-tuner (`lora_unet_` with its
flattened names, the top-level layers included) and lightx2v's bare names (Qwen-Image-Lightning's files). The
reference is diffusers' own result (`load_lora_weights` + `fuse_lora`) on a pipeline of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from diffusers import QwenImagePipeline
from PIL import Image

from serving.demo.synthetic import save_lora
from tests.support.dit import PROMPT

QwenFormat = Literal["peft", "peft_default", "comfy", "comfy_down", "kohya", "bare", "bare_peft", "bare_default"]

# The layers a Qwen-Image LoRA adapts (diffusers' module names): both streams' attention projections, MLPs and
# modulations in the first block, a few in the second, and the top-level layers kohya names apart.
MODULES = (
    "transformer_blocks.0.attn.to_q",
    "transformer_blocks.0.attn.to_k",
    "transformer_blocks.0.attn.to_v",
    "transformer_blocks.0.attn.to_out.0",
    "transformer_blocks.0.attn.add_q_proj",
    "transformer_blocks.0.attn.add_k_proj",
    "transformer_blocks.0.attn.add_v_proj",
    "transformer_blocks.0.attn.to_add_out",
    "transformer_blocks.0.img_mlp.net.0.proj",
    "transformer_blocks.0.img_mlp.net.2",
    "transformer_blocks.0.txt_mlp.net.0.proj",
    "transformer_blocks.0.txt_mlp.net.2",
    "transformer_blocks.0.img_mod.1",
    "transformer_blocks.0.txt_mod.1",
    "transformer_blocks.1.attn.to_q",
    "transformer_blocks.1.attn.to_v",
    "transformer_blocks.1.img_mlp.net.2",
    "img_in",
    "txt_in",
    "proj_out",
    "norm_out.linear",
)


@dataclass(frozen=True)
class QwenCase:
    name: str
    fmt: QwenFormat
    alpha: float | None = 2.0
    seed: int = 1

    @property
    def file_name(self) -> str:
        return f"qwen_{self.name}.safetensors"

    @property
    def twin(self) -> QwenFormat | None:
        """diffusers 0.42 re-prefixes `transformer.` names it converts (those with `.alpha` or PEFT's `default.`)
        as `transformer.transformer.` and then finds no such layer: the same factors under bare names stand in."""
        if self.fmt == "peft_default":
            return "bare_default"
        return "bare_peft" if self.fmt == "peft" and self.alpha is not None else None

    @property
    def reference_name(self) -> str:
        return f"qwen_{self.name}_twin.safetensors" if self.twin else self.file_name


CASES = (
    QwenCase("peft", "peft", alpha=None, seed=51),
    QwenCase("peft_alpha", "peft", seed=52),
    QwenCase("peft_default", "peft_default", alpha=None, seed=53),
    QwenCase("comfy", "comfy", seed=54),
    QwenCase("comfy_down", "comfy_down", seed=55),
    QwenCase("kohya", "kohya", seed=56),
    QwenCase("bare", "bare", seed=57),
)


def factors(
    transformer: torch.nn.Module, modules: Sequence[str] = MODULES, *, rank: int = 4, seed: int = 1
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random (down, up) factors for each module, sized from the transformer's own layers."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for module in modules:
        layer = transformer.get_submodule(module)
        down = torch.randn(rank, layer.in_features, generator=generator) / layer.in_features**0.5
        up = torch.randn(layer.out_features, rank, generator=generator) * 0.3
        made[module] = (down, up)
    return made


def lora_file(made: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: QwenFormat, alpha: float | None) -> dict:
    """The tensors of a file in `fmt` names."""
    stems = {
        "peft": ("transformer.{}", "lora_A.weight", "lora_B.weight"),
        "peft_default": ("transformer.{}", "lora_A.default.weight", "lora_B.default.weight"),
        "comfy": ("diffusion_model.{}", "lora_A.weight", "lora_B.weight"),
        "comfy_down": ("diffusion_model.{}", "lora_down.weight", "lora_up.weight"),
        "kohya": ("lora_unet_{}", "lora_down.weight", "lora_up.weight"),
        "bare": ("{}", "lora_down.weight", "lora_up.weight"),
        "bare_peft": ("{}", "lora_A.weight", "lora_B.weight"),
        "bare_default": ("{}", "lora_A.default.weight", "lora_B.default.weight"),
    }
    form, a, b = stems[fmt]
    tensors: dict[str, torch.Tensor] = {}
    for module, (down, up) in made.items():
        stem = form.format(module.replace(".", "_") if fmt == "kohya" else module)
        tensors[f"{stem}.{a}"] = down
        tensors[f"{stem}.{b}"] = up
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)
    return tensors


def write_qwen_loras(
    pipe: Any, folder: Path, *, cases: Sequence[QwenCase] = CASES, metadata: Mapping[str, str] | None = None
) -> dict[str, QwenCase]:
    """Each case's file in `folder` (rank 4), by case name, with `metadata` (a trainer's, e.g. the base it
    declares)."""
    for case in cases:
        made = factors(pipe.transformer, seed=case.seed)
        save_lora(folder / case.file_name, lora_file(made, case.fmt, case.alpha), metadata)
        if case.twin is not None:
            save_lora(folder / case.reference_name, lora_file(made, case.twin, case.alpha), metadata)
    return {case.name: case for case in cases}


def diffusers_image(
    tiny_dir: Path,
    folder: Path,
    weight_name: str | None,
    *,
    scale: float = 1.0,
    guidance: float = 1.0,
    negative_prompt: str = " ",
) -> Image.Image:
    """diffusers' own result on a pipeline of its own: load_lora_weights, fuse_lora of the transformer (the one
    component its Qwen-Image loader adapts), three steps at 64 px, seed 7; true CFG (with the card's " " for a
    negative prompt) above 1."""
    pipe: Any = QwenImagePipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.fuse_lora(components=["transformer"], lora_scale=scale)
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(
        prompt=PROMPT,
        negative_prompt=negative_prompt if guidance > 1 else None,
        true_cfg_scale=guidance,
        num_inference_steps=3,
        width=64,
        height=64,
        generator=generator,
    ).images[0]
