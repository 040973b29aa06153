"""Wan LoRA files for the tiny Wan pipeline, in every naming diffusers' `WanPipeline.lora_state_dict` reads:
diffusers/PEFT (`transformer.blocks.N.attn1.to_q.lora_A`), ComfyUI's `diffusion_model.` over Wan's original layers
(`self_attn.q.lora_down`, with `.alpha`), ai-toolkit's `diffusion_model.` with `lora_A`/`lora_B`, musubi-tuner's
`lora_unet_` (every layer of every block, with alphas); and ComfyUI's with norm and weight `.diff` deltas, which
the engine applies (diffusers drops them). diffusers' reference loads each file itself, and takes full differences
added to its weights by hand (ComfyUI's math)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from diffusers import WanPipeline
from PIL import Image

from serving.demo.synthetic import save_lora

WanFormat = Literal["peft", "comfy", "aitk", "musubi", "comfy_diff"]
# diffusers' name of each layer -> Wan's original one (ComfyUI's and musubi's).
_ORIGINAL = {
    "attn1.to_q": "self_attn.q",
    "attn1.to_k": "self_attn.k",
    "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q",
    "attn2.to_k": "cross_attn.k",
    "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
    # Image-to-video's own: the cross-attention's image keys and values.
    "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img",
}
# The image embedder's layers (diffusers' names -> Wan's original `img_emb`).
_EMBEDDER = {
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
}
# Every layer of the tiny transformer's 2 blocks a Wan LoRA adapts (musubi-tuner's files hold all of them).
MODULES = tuple(f"blocks.{i}.{layer}" for i in range(2) for layer in list(_ORIGINAL)[:10])
# And of the tiny image-to-video transformer's, with its image layers.
I2V_MODULES = (*(f"blocks.{i}.{layer}" for i in range(2) for layer in _ORIGINAL), *_EMBEDDER)
PROMPT = "a photo of a fox in sks style"
FRAMES = 5


@dataclass(frozen=True)
class WanCase:
    name: str
    fmt: WanFormat
    alpha: float | None = 2.0
    seed: int = 1
    modules: Sequence[str] = MODULES

    @property
    def file_name(self) -> str:
        return f"wan_{self.name}.safetensors"

    @property
    def reference_name(self) -> str:
        return self.file_name


CASES = (
    WanCase("peft", "peft", alpha=None, seed=51, modules=MODULES[:6] + MODULES[12:]),
    WanCase("comfy", "comfy", alpha=4.0, seed=52, modules=MODULES[:4] + MODULES[8:14]),
    WanCase("aitk", "aitk", alpha=None, seed=53),
    WanCase("musubi", "musubi", seed=54),
)
# ComfyUI's file with norm and weight `.diff` deltas: applied as full differences (engine.formats.differences),
# where diffusers drops them with a log line.
DIFF_CASE = WanCase("comfy_diff", "comfy_diff", seed=55)


def factors(transformer: torch.nn.Module, modules: Sequence[str], *, rank: int = 4, seed: int = 1) -> dict:
    """Random (down, up) factors for each module, sized from the transformer's own layers."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for module in modules:
        layer = transformer.get_submodule(module)
        down = torch.randn(rank, layer.in_features, generator=generator) / layer.in_features**0.5
        up = torch.randn(layer.out_features, rank, generator=generator) * 0.5
        made[module] = (down, up)
    return made


def _original(module: str) -> str:
    if module in _EMBEDDER:
        return _EMBEDDER[module]
    block, _, layer = module.partition(".")[2].partition(".")
    return f"blocks.{block}.{_ORIGINAL[layer]}"


def lora_file(made: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: WanFormat, alpha: float | None) -> dict:
    """The tensors of a file in `fmt` names."""
    tensors: dict[str, torch.Tensor] = {}
    for module, (down, up) in made.items():
        if fmt == "peft":
            stem, a, b = f"transformer.{module}", "lora_A.weight", "lora_B.weight"
        elif fmt == "aitk":
            stem, a, b = f"diffusion_model.{_original(module)}", "lora_A.weight", "lora_B.weight"
        elif fmt == "musubi":
            stem, a, b = "lora_unet_" + _original(module).replace(".", "_"), "lora_down.weight", "lora_up.weight"
        else:
            stem, a, b = f"diffusion_model.{_original(module)}", "lora_down.weight", "lora_up.weight"
        tensors[f"{stem}.{a}"], tensors[f"{stem}.{b}"] = down, up
        # diffusers' converter reads no alpha of the image embedder (0.42.1 refuses a file with one).
        if alpha is not None and module not in _EMBEDDER:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)
    if fmt == "comfy_diff":
        # What diffusers drops: the norms' deltas, and a full-weight delta of a layer without factors.
        tensors["diffusion_model.blocks.0.norm3.diff"] = torch.ones(44)
        tensors["diffusion_model.blocks.0.norm3.diff_b"] = torch.ones(44)
        tensors["diffusion_model.blocks.1.self_attn.norm_q.diff"] = torch.ones(44)
        tensors["diffusion_model.blocks.1.self_attn.q.diff"] = torch.ones(44, 44)
    return tensors


def write_wan_loras(pipe: Any, folder: Path, cases: Sequence[WanCase] = (*CASES, DIFF_CASE)) -> None:
    for case in cases:
        made = factors(pipe.transformer, case.modules, seed=case.seed)
        save_lora(folder / case.file_name, lora_file(made, case.fmt, case.alpha))


# Image-to-video's namings: ComfyUI's with the image layers and embedder, musubi-tuner's with the image keys and
# values (its converter reads no embedder), diffusers/PEFT's; and a text-to-video file, which runs there too.
I2V_CASES = (
    WanCase("i2v_comfy", "comfy", alpha=4.0, seed=61, modules=I2V_MODULES),
    WanCase("i2v_musubi", "musubi", seed=62, modules=I2V_MODULES[:24]),
    WanCase("i2v_peft", "peft", alpha=None, seed=63, modules=I2V_MODULES[8:]),
)


def diffusers_frames(
    tiny_dir: Path,
    folder: Path,
    weight_name: str | None,
    scale: float = 1.0,
    *,
    pipeline_class: Any = WanPipeline,
    image: Image.Image | None = None,
    sides: Sequence[str] = ("transformer",),
    guidance_2: float | None = None,
    per_side: Mapping[str, tuple[str, float]] | None = None,
    differences: Mapping[str, torch.Tensor] | None = None,
) -> list[Image.Image]:
    """diffusers' own video on a pipeline of its own from `tiny_dir` (an image-to-video one from `image`):
    load_lora_weights, then fuse_lora of the transformer; three steps at 64 px, 5 frames, seed 7, the pool's
    CFG 5; no LoRA when `weight_name` is None. `sides`: the transformers the file is loaded into (a two-stage
    pipeline's `transformer_2` with `load_into_transformer_2=True`), each fused; `per_side` instead: each side's own
    file and scale (its own adapter, fused with its own `lora_scale`). `differences`: full differences by the
    transformer's parameter names, each added at `scale` before the file is loaded (ComfyUI's W += strength · diff,
    which diffusers' loader would drop)."""
    pipe: Any = pipeline_class.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        for name, difference in (differences or {}).items():
            pipe.transformer.get_parameter(name).add_(difference, alpha=scale)
    if per_side is None:
        per_side = {} if weight_name is None else {side: (weight_name, scale) for side in sides}
    for side, (name, _) in per_side.items():
        low = {"load_into_transformer_2": True} if side == "transformer_2" else {}
        pipe.load_lora_weights(str(folder), weight_name=name, adapter_name=f"a_{side}", **low)
    for side, (_, side_scale) in per_side.items():
        pipe.fuse_lora(components=[side], lora_scale=side_scale, adapter_names=[f"a_{side}"])
    generator = torch.Generator("cpu").manual_seed(7)
    output = pipe(
        **({} if image is None else {"image": image}),
        prompt=PROMPT,
        num_inference_steps=3,
        guidance_scale=5.0 if guidance_2 is None else 4.0,
        **({} if guidance_2 is None else {"guidance_scale_2": guidance_2}),
        width=64,
        height=64,
        num_frames=FRAMES,
        generator=generator,
        output_type="pil",
    )
    return list(output.frames[0])
