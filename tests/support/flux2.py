"""FLUX.2 [klein] LoRA files for the tiny klein pipeline, in every naming diffusers' `Flux2LoraLoaderMixin` reads:
diffusers/PEFT (`transformer.`), ai-toolkit's BFL names (`diffusion_model.double_blocks…lora_A`), its expanded
diffusers block names (`diffusion_model.transformer_blocks…`, and the legacy `sformer_blocks` alias), PEFT's
`base_model.model.` over BFL names, kohya's `lora_unet_` with `.alpha` (the fused qkv dense or sparse), and
ComfyUI's BFL names with `lora_down`/`.alpha`, which diffusers drops: its reference is its ai-toolkit twin (the
same factors, the alpha folded into the down factor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from serving.demo.synthetic import save_lora

Flux2Format = Literal["peft", "aitk", "expanded", "sformer", "peft_bfl", "kohya", "comfy"]

# BFL's layer -> the diffusers modules it stands for (several: a fused qkv, split by the converters).
BFL_LAYERS: dict[str, tuple[str, ...]] = {
    "double_blocks.0.img_attn.qkv": tuple(f"transformer_blocks.0.attn.to_{p}" for p in "qkv"),
    "double_blocks.0.img_attn.proj": ("transformer_blocks.0.attn.to_out.0",),
    "double_blocks.0.txt_attn.qkv": tuple(f"transformer_blocks.0.attn.add_{p}_proj" for p in "qkv"),
    "double_blocks.1.txt_attn.proj": ("transformer_blocks.1.attn.to_add_out",),
    "double_blocks.0.img_mlp.0": ("transformer_blocks.0.ff.linear_in",),
    "double_blocks.0.img_mlp.2": ("transformer_blocks.0.ff.linear_out",),
    "double_blocks.1.txt_mlp.0": ("transformer_blocks.1.ff_context.linear_in",),
    "double_blocks.1.txt_mlp.2": ("transformer_blocks.1.ff_context.linear_out",),
    "single_blocks.0.linear1": ("single_transformer_blocks.0.attn.to_qkv_mlp_proj",),
    "single_blocks.1.linear2": ("single_transformer_blocks.1.attn.to_out",),
    "img_in": ("x_embedder",),
    "txt_in": ("context_embedder",),
    "time_in.in_layer": ("time_guidance_embed.timestep_embedder.linear_1",),
    "final_layer.linear": ("proj_out",),
}
# The BFL layers diffusers' ai-toolkit converter reads and its kohya one does not (the shared modulations).
AITK_ONLY: dict[str, tuple[str, ...]] = {
    "single_stream_modulation.lin": ("single_stream_modulation.linear",),
    "final_layer.adaLN_modulation.1": ("norm_out.linear",),
}
# The double-block attention alone: the names FLUX.2 shares with FLUX.1 where no MLP width tells them apart.
ATTENTION = ("double_blocks.0.img_attn.qkv", "double_blocks.0.img_attn.proj", "double_blocks.0.txt_attn.qkv")


@dataclass(frozen=True)
class Flux2Case:
    name: str
    fmt: Flux2Format
    alpha: float | None = None
    sparse: bool = False
    seed: int = 1

    @property
    def file_name(self) -> str:
        return f"flux2_{self.name}.safetensors"

    @property
    def reference_name(self) -> str:
        """diffusers drops ComfyUI's `lora_down` names silently: its ai-toolkit twin stands in."""
        return f"flux2_{self.name}_twin.safetensors" if self.fmt == "comfy" else self.file_name


CASES = (
    Flux2Case("peft", "peft", seed=61),
    Flux2Case("aitk", "aitk", seed=62),
    Flux2Case("expanded", "expanded", seed=63),
    Flux2Case("sformer", "sformer", seed=64),
    Flux2Case("peft_bfl", "peft_bfl", seed=65),
    Flux2Case("kohya", "kohya", alpha=2.0, seed=66),
    Flux2Case("kohya_sparse", "kohya", sparse=True, seed=67),
    Flux2Case("comfy", "comfy", alpha=2.0, seed=68),
)

Factors = dict[str, tuple[torch.Tensor, torch.Tensor]]


def factors(
    transformer: torch.nn.Module, layers=None, *, rank: int = 4, seed: int = 1, sparse: bool = False
) -> Factors:
    """Random (down, up) factors for each BFL layer, sized from the transformer's modules (a fused qkv: the
    sum of their outputs). `sparse`: a qkv's up factor block-diagonal over rank/3 columns each (kohya's sparse
    form, which diffusers' converter splits without copying the down factor)."""
    generator = torch.Generator().manual_seed(seed)
    made: Factors = {}
    for bfl, modules in (layers or {**BFL_LAYERS, **AITK_ONLY}).items():
        parts = [transformer.get_submodule(m) for m in modules]
        width, rows = parts[0].in_features, sum(p.out_features for p in parts)
        r = 3 * rank if sparse and len(parts) == 3 else rank
        down = torch.randn(r, width, generator=generator) / width**0.5
        up = torch.randn(rows, r, generator=generator) * 0.5
        if sparse and len(parts) == 3:
            mask = torch.block_diag(*(torch.ones(p.out_features, rank) for p in parts))
            up = up * mask
        made[bfl] = (down, up)
    return made


def _diffusers_split(made: Factors, layers) -> Factors:
    """The same factors over diffusers' modules (a fused qkv's down factor shared, its up factor split)."""
    split: Factors = {}
    for bfl, (down, up) in made.items():
        modules = layers[bfl]
        rows = up.shape[0] // len(modules)
        for index, module in enumerate(modules):
            split[module] = (down, up[index * rows : (index + 1) * rows])
    return split


def lora_file(made: Factors, fmt: Flux2Format, alpha: float | None = None, layers=None) -> dict[str, torch.Tensor]:
    """The tensors of a file in `fmt` names."""
    layers = layers or {**BFL_LAYERS, **AITK_ONLY}
    tensors: dict[str, torch.Tensor] = {}

    def put(stem: str, down: torch.Tensor, up: torch.Tensor, a: str, b: str) -> None:
        tensors[f"{stem}.{a}"], tensors[f"{stem}.{b}"] = down.clone(), up.clone()
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)

    if fmt in ("peft", "expanded", "sformer"):
        prefix = {"peft": "transformer.", "expanded": "diffusion_model.", "sformer": "diffusion_model."}[fmt]
        blocks = made
        if fmt != "peft":
            # diffusers reads expanded names for the blocks only: the other layers keep BFL's.
            blocks = {k: v for k, v in made.items() if "blocks." in k}
            for bfl, (down, up) in made.items():
                if bfl not in blocks:
                    put(f"diffusion_model.{bfl}", down, up, "lora_A.weight", "lora_B.weight")
        for module, (down, up) in _diffusers_split(blocks, layers).items():
            if fmt == "sformer":
                module = module.removeprefix("tran")  # transformer_blocks. -> sformer_blocks.
            put(prefix + module, down, up, "lora_A.weight", "lora_B.weight")
        return tensors
    for bfl, (down, up) in made.items():
        if fmt == "kohya":
            put("lora_unet_" + bfl.replace(".", "_"), down, up, "lora_down.weight", "lora_up.weight")
        elif fmt == "comfy":
            put(f"diffusion_model.{bfl}", down, up, "lora_down.weight", "lora_up.weight")
        else:
            prefix = "base_model.model." if fmt == "peft_bfl" else "diffusion_model."
            put(prefix + bfl, down, up, "lora_A.weight", "lora_B.weight")
    return tensors


def folded(made: Factors, alpha: float) -> Factors:
    """The factors with alpha/rank folded into each down factor (what a file without alphas holds)."""
    return {k: (down * (alpha / down.shape[0]), up) for k, (down, up) in made.items()}


def write_flux2_loras(pipe, folder: Path, *, cases=CASES) -> dict[str, Flux2Case]:
    """Each case's file in `folder` (rank 4; kohya's files without the layers its converter does not read), and
    ComfyUI's ai-toolkit twin, by case name."""
    for case in cases:
        layers = BFL_LAYERS if case.fmt == "kohya" else {**BFL_LAYERS, **AITK_ONLY}
        made = factors(pipe.transformer, layers, seed=case.seed, sparse=case.sparse)
        save_lora(folder / case.file_name, lora_file(made, case.fmt, case.alpha, layers))
        if case.reference_name != case.file_name:
            twin = folded(made, case.alpha) if case.alpha is not None else made
            save_lora(folder / case.reference_name, lora_file(twin, "aitk", None, layers))
    return {case.name: case for case in cases}
