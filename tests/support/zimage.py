"""Z-Image LoRA files for the tiny Z-Image pipeline, in every naming diffusers' `ZImagePipeline.lora_state_dict`
reads: diffusers/PEFT, ai-toolkit/ComfyUI's `diffusion_model.` with `.alpha`, kohya's `lora_unet_` (with
Z-Image's original `attention_out`, and its fused `attention_qkv`), ComfyUI's names over the original layers
(`diffusion_model.<block>.attention.qkv.lora_down`), and the dotted form with the fused `qkv`. diffusers' reference
loads the file itself, but for ComfyUI's fused `qkv`, which it drops silently: there its kohya-named twin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from serving.demo.synthetic import save_lora

ZImageFormat = Literal["peft", "comfy", "comfy_native", "kohya", "dotted"]

# The layers a Z-Image LoRA adapts (diffusers' module names): attention and feed-forward in the main blocks
# and both refiners, and the modulations.
MODULES = (
    "layers.0.attention.to_q",
    "layers.0.attention.to_k",
    "layers.0.attention.to_v",
    "layers.0.attention.to_out.0",
    "layers.0.feed_forward.w1",
    "layers.0.feed_forward.w2",
    "layers.0.feed_forward.w3",
    "layers.0.adaLN_modulation.0",
    "layers.1.attention.to_q",
    "layers.1.attention.to_v",
    "layers.1.feed_forward.w3",
    "noise_refiner.0.attention.to_k",
    "noise_refiner.0.feed_forward.w2",
    "context_refiner.0.attention.to_q",
    "context_refiner.0.attention.to_out.0",
)


@dataclass(frozen=True)
class ZImageCase:
    name: str
    fmt: ZImageFormat
    alpha: float | None = 2.0
    seed: int = 1
    # Z-Image's original fused `attention.qkv` (one down factor for q, k and v), as diffusers' converter splits it.
    fused_qkv: bool = False

    @property
    def file_name(self) -> str:
        return f"zimage_{self.name}.safetensors"

    @property
    def reference_name(self) -> str:
        """diffusers drops ComfyUI's fused `qkv` silently: its kohya-named twin (the same factors) stands in."""
        return f"zimage_{self.name}_twin.safetensors" if self.fmt == "comfy_native" else self.file_name


CASES = (
    ZImageCase("peft", "peft", alpha=None, seed=41),
    ZImageCase("comfy", "comfy", seed=42),
    ZImageCase("kohya", "kohya", seed=43),
    ZImageCase("kohya_qkv", "kohya", fused_qkv=True, seed=45),
    ZImageCase("comfy_qkv", "comfy_native", fused_qkv=True, seed=46),
    # diffusers looks a dotted `to.q` alpha up as `to_q.alpha`; files of this form seen carry none.
    ZImageCase("dotted", "dotted", alpha=None, fused_qkv=True, seed=44),
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
        up = torch.randn(layer.out_features, rank, generator=generator) * 0.5
        made[module] = (down, up)
    return made


def _kohya_stem(module: str) -> str:
    # kohya writes Z-Image's original output projection, `attention.out`; diffusers' converter renames it.
    return "lora_unet_" + module.replace("attention.to_out.0", "attention.out").replace(".", "_")


def lora_file(
    made: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: ZImageFormat, alpha: float | None, fused_qkv: bool = False
) -> dict[str, torch.Tensor]:
    """The tensors of a file in `fmt` names; `fused_qkv`: a block adapting q, k and v holds them as one `qkv`
    (kohya's and the dotted form only; their down factor must be shared)."""
    tensors: dict[str, torch.Tensor] = {}

    def put(stem: str, down: torch.Tensor, up: torch.Tensor, a: str, b: str) -> None:
        tensors[f"{stem}.{a}"] = down
        tensors[f"{stem}.{b}"] = up
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)

    blocks = {m.rpartition(".attention.")[0] for m in made if ".attention.to_" in m}
    fused = {b for b in blocks if all(f"{b}.attention.to_{p}" in made for p in "qkv")} if fused_qkv else set()
    for module, (down, up) in made.items():
        block, _, proj = module.rpartition(".attention.")
        if block in fused and proj in ("to_q", "to_k", "to_v"):
            continue
        if fmt == "peft":
            put(f"transformer.{module}", down, up, "lora_A.weight", "lora_B.weight")
        elif fmt == "comfy":
            put(f"diffusion_model.{module}", down, up, "lora_A.weight", "lora_B.weight")
        elif fmt == "kohya":
            put(_kohya_stem(module), down, up, "lora_down.weight", "lora_up.weight")
        elif fmt == "comfy_native":
            original = module.replace("attention.to_out.0", "attention.out")
            put(f"diffusion_model.{original}", down, up, "lora_down.weight", "lora_up.weight")
        else:
            dotted = module
            for p in "qkv":
                dotted = dotted.replace(f"attention.to_{p}", f"attention.to.{p}")
            put(f"diffusion_model.{dotted}", down, up, "lora.down.weight", "lora.up.weight")
    for block in fused:
        parts = [made[f"{block}.attention.to_{p}"] for p in "qkv"]
        down, up = parts[0][0], torch.cat([up for _, up in parts])
        if fmt == "kohya":
            put(_kohya_stem(f"{block}.attention.qkv"), down, up, "lora_down.weight", "lora_up.weight")
        elif fmt == "comfy_native":
            put(f"diffusion_model.{block}.attention.qkv", down, up, "lora_down.weight", "lora_up.weight")
        else:
            put(f"diffusion_model.{block}.attention.qkv", down, up, "lora.down.weight", "lora.up.weight")
    return tensors


def with_shared_qkv_down(made: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """The same factors with one down factor per block's q, k and v (what a fused qkv layer's LoRA holds)."""
    shared = dict(made)
    for module, (down, _) in made.items():
        if module.endswith(".attention.to_q"):
            block = module.removesuffix(".attention.to_q")
            for p in "kv":
                key = f"{block}.attention.to_{p}"
                if key in shared:
                    shared[key] = (down.clone(), shared[key][1])
    return shared


def write_zimage_loras(pipe, folder: Path, *, cases=CASES) -> dict[str, ZImageCase]:
    """Each case's file in `folder` (rank 4), by case name."""
    for case in cases:
        made = factors(pipe.transformer, seed=case.seed)
        if case.fused_qkv:
            made = with_shared_qkv_down(made)
        save_lora(folder / case.file_name, lora_file(made, case.fmt, case.alpha, case.fused_qkv))
        if case.reference_name != case.file_name:
            save_lora(folder / case.reference_name, lora_file(made, "kohya", case.alpha, case.fused_qkv))
    return {case.name: case for case in cases}
