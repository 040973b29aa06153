"""Krea 2 LoRA files for the tiny Krea 2 pipeline, in every naming diffusers' `Krea2Pipeline.lora_state_dict` reads:
diffusers/PEFT (`transformer.`), the original model's names under `diffusion_model.` (the reference trainer,
ComfyUI) and `base_model.model.` (ai-toolkit); and kohya's, which it refuses (`lora_down` / `lora_up` with
`.alpha`, under `lora_unet_` or `diffusion_model.`). diffusers' reference loads each file it reads itself; for
kohya's, the same factors with the alpha folded (kohya's scale, alpha / rank) in the original names stand in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from diffusers import Krea2Transformer2DModel

from engine.families.krea2_tiny import TINY_TRANSFORMER
from serving.demo.synthetic import save_lora

Krea2Format = Literal["peft", "comfy", "aitk", "kohya", "comfy_kohya"]

# The layers a Krea 2 LoRA adapts (diffusers' module names): the main blocks' attention (gate included) and MLP,
# a text-fusion block's, and the standalone modules ai-toolkit targets.
MODULES = (
    "transformer_blocks.0.attn.to_q",
    "transformer_blocks.0.attn.to_k",
    "transformer_blocks.0.attn.to_v",
    "transformer_blocks.0.attn.to_out.0",
    "transformer_blocks.0.attn.to_gate",
    "transformer_blocks.0.ff.gate",
    "transformer_blocks.0.ff.up",
    "transformer_blocks.0.ff.down",
    "transformer_blocks.1.attn.to_q",
    "transformer_blocks.1.attn.to_v",
    "transformer_blocks.1.ff.down",
    "text_fusion.refiner_blocks.0.attn.to_k",
    "text_fusion.layerwise_blocks.0.ff.up",
    "time_mod_proj",
    "txt_in.linear_1",
)
# The original model's names (diffusers' converter's tables, inverted).
_ORIGINAL = {
    "attn.to_q": "attn.wq",
    "attn.to_k": "attn.wk",
    "attn.to_v": "attn.wv",
    "attn.to_out.0": "attn.wo",
    "attn.to_gate": "attn.gate",
    "ff.": "mlp.",
}
_STANDALONE = {"time_mod_proj": "tproj.1", "txt_in.linear_1": "txtmlp.1"}


@dataclass(frozen=True)
class Krea2Case:
    name: str
    fmt: Krea2Format
    alpha: float | None = None
    seed: int = 1

    @property
    def file_name(self) -> str:
        return f"krea2_{self.name}.safetensors"

    @property
    def reference_name(self) -> str:
        """diffusers refuses kohya's names and alphas: its folded twin in ComfyUI's names stands in."""
        return f"krea2_{self.name}_twin.safetensors" if self.fmt in ("kohya", "comfy_kohya") else self.file_name


CASES = (
    Krea2Case("peft", "peft", seed=61),
    Krea2Case("comfy", "comfy", seed=62),
    Krea2Case("aitk", "aitk", seed=63),
    Krea2Case("kohya", "kohya", alpha=2.0, seed=64),
    Krea2Case("comfy_kohya", "comfy_kohya", alpha=8.0, seed=65),
)


def original(module: str) -> str:
    """The original model's name of one of diffusers' module names."""
    if module in _STANDALONE:
        return _STANDALONE[module]
    name = module.replace("transformer_blocks.", "blocks.").replace("text_fusion.", "txtfusion.")
    for new, old in _ORIGINAL.items():
        name = name.replace(new, old)
    return name


def factors(
    transformer: torch.nn.Module, modules: Sequence[str] = MODULES, *, rank: int = 4, seed: int = 1
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Random (down, up) factors for each module, sized from the transformer's own layers."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for module in modules:
        layer = transformer.get_submodule(module)
        down = torch.randn(rank, layer.in_features, generator=generator) / layer.in_features**0.5
        up = torch.randn(layer.out_features, rank, generator=generator) * 4.0
        made[module] = (down, up)
    return made


def lora_file(
    made: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: Krea2Format, alpha: float | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of a file in `fmt` names (an alpha only in kohya's)."""
    tensors: dict[str, torch.Tensor] = {}
    for module, (down, up) in made.items():
        if fmt == "peft":
            stem, a, b = f"transformer.{module}", "lora_A.weight", "lora_B.weight"
        elif fmt in ("comfy", "aitk"):
            prefix = "diffusion_model." if fmt == "comfy" else "base_model.model."
            stem, a, b = prefix + original(module), "lora_A.weight", "lora_B.weight"
        else:
            kohya = "lora_unet_" + original(module).replace(".", "_")
            stem = kohya if fmt == "kohya" else f"diffusion_model.{original(module)}"
            a, b = "lora_down.weight", "lora_up.weight"
        tensors[f"{stem}.{a}"], tensors[f"{stem}.{b}"] = down, up
        if alpha is not None:
            tensors[f"{stem}.alpha"] = torch.tensor(alpha)
    return tensors


def folded(made: dict[str, tuple[torch.Tensor, torch.Tensor]], alpha: float) -> dict:
    """The same factors with kohya's scale (alpha / rank) folded into each down factor."""
    return {m: (down * (alpha / down.shape[0]), up) for m, (down, up) in made.items()}


def write_krea2_loras(pipe, folder: Path, *, cases=CASES, metadata=None) -> dict[str, Krea2Case]:
    """Each case's file in `folder` (rank 4), by case name, and kohya's folded twins."""
    for case in cases:
        made = factors(pipe.transformer, seed=case.seed)
        save_lora(folder / case.file_name, lora_file(made, case.fmt, case.alpha), metadata)
        if case.reference_name != case.file_name and case.alpha is not None:
            save_lora(folder / case.reference_name, lora_file(folded(made, case.alpha), "comfy"), metadata)
    return {case.name: case for case in cases}


def transformer_128_wide() -> Krea2Transformer2DModel:
    """The tiny Krea 2 transformer 128 wide (4 heads of 32) instead of 104, which neither int4's 32-value groups
    nor GGUF's Q8_0 blocks divide; the rest as the tiny one's (its text stage fits the tiny encoder)."""
    return Krea2Transformer2DModel(**{**TINY_TRANSFORMER, "attention_head_dim": 32, "axes_dims_rope": (8, 12, 12)})
