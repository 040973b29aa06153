"""Krea 2's LoRA names: diffusers' converter (`Krea2Pipeline.lora_state_dict`) for what it reads, and kohya's
names and alphas, which it refuses, put in the original names it reads first.

diffusers 0.42.1 reads `lora_A` / `lora_B` factors in diffusers' names, or in the original model's under
`diffusion_model.` (the reference trainer, ComfyUI) or `base_model.model.` (ai-toolkit); any other tensor of such a
file (`.alpha`, kohya's `lora_down` / `lora_up`, a `lora_unet_` name) raises its "should be empty" ValueError. Here
kohya's factors become `lora_A` / `lora_B` with each `.alpha` folded into the down factor (kohya's scale is
alpha / rank), and a `lora_unet_` name becomes the original module it spells, found by asking diffusers' converter
which original name gives each of the served transformer's modules; a name that spells none is refused by name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import Krea2Pipeline

__all__ = ["convert_lora", "lycoris_modules", "original_names"]

# The original model's names of diffusers' modules (the inverse of diffusers' `_convert_non_diffusers_krea2_lora_
# to_diffusers` tables); each is checked against diffusers' converter before use (`original_names`).
_ATTENTION = {"to_q": "wq", "to_k": "wk", "to_v": "wv", "to_out.0": "wo", "to_gate": "gate"}
_STANDALONE = {
    "img_in": "first",
    "final_layer.linear": "last.linear",
    "time_embed.linear_1": "tmlp.0",
    "time_embed.linear_2": "tmlp.2",
    "time_mod_proj": "tproj.1",
    "txt_in.linear_1": "txtmlp.1",
    "txt_in.linear_2": "txtmlp.3",
    "text_fusion.projector": "txtfusion.projector",
}
_BLOCK = re.compile(r"^(transformer_blocks|text_fusion\.(?:layerwise|refiner)_blocks)\.(\d+)\.(attn|ff)\.(.+)$")
_KOHYA = ("lora_down.weight", "lora_up.weight", "alpha")
# diffusers' converter reports what it cannot read with these.
_CONVERTER_ERRORS = (ValueError, AssertionError, RuntimeError, KeyError, TypeError, AttributeError, IndexError)


def _original(module: str) -> str | None:
    """The original name of one of diffusers' module names, or None where it has none."""
    if module in _STANDALONE:
        return _STANDALONE[module]
    found = _BLOCK.match(module)
    if found is None:
        return None
    blocks, index, kind, sub = found.groups()
    blocks = "blocks" if blocks == "transformer_blocks" else blocks.replace("text_fusion.", "txtfusion.")
    if kind == "attn":
        return f"{blocks}.{index}.attn.{_ATTENTION[sub]}" if sub in _ATTENTION else None
    return f"{blocks}.{index}.mlp.{sub}"


def original_names(denoiser: Any) -> dict[str, str]:
    """The served transformer's Linears by original name -> diffusers' name, each as diffusers' converter maps it."""
    return dict(_checked(tuple(name for name, m in denoiser.named_modules() if isinstance(m, torch.nn.Linear))))


@functools.lru_cache(maxsize=8)
def _checked(modules: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    originals = {o: m for m in modules if (o := _original(m)) is not None}
    probe = {f"diffusion_model.{o}.lora_A.weight": torch.zeros(1, 1) for o in originals}
    converted = Krea2Pipeline.lora_state_dict(probe)
    return tuple((o, m) for o, m in originals.items() if f"transformer.{m}.lora_A.weight" in converted)


def lycoris_modules(stem: str, denoiser: Any) -> tuple[str, ...] | None:
    """The transformer's modules a LyCORIS module in the original names (`diffusion_model.`, `base_model.model.`,
    kohya's `lora_unet_`) changes: its one layer, or for the original fused `attn.qkv` (as some trainers write a
    LoKr) diffusers' `to_q`, `to_k`, `to_v`, whose rows it stacks in that order. None: not such a name."""
    originals = original_names(denoiser)
    if stem.startswith("lora_unet_"):
        spelled = {f"lora_unet_{o.replace('.', '_')}": o for o in originals}
        fused = stem.removesuffix("_attn_qkv")
        parts = [spelled.get(f"{fused}_attn_w{p}") for p in "qkv"] if fused != stem else [spelled.get(stem)]
    elif stem.startswith(("diffusion_model.", "base_model.model.")):
        name = stem.removeprefix("diffusion_model.").removeprefix("base_model.model.")
        fused = name.removesuffix(".attn.qkv")
        parts = [f"{fused}.attn.w{p}" for p in "qkv"] if fused != name else [name]
    else:
        return None
    modules = [originals.get(p) for p in parts if p is not None]
    return tuple(m for m in modules if m is not None) if len(modules) == len(parts) and None not in modules else None


def _kohya_stems(stems: set[str], denoiser: Any) -> dict[str, str]:
    """Each `lora_unet_` stem -> the original module name it spells (its dots as underscores)."""
    spelled = {f"lora_unet_{o.replace('.', '_')}": o for o in original_names(denoiser)}
    unknown = sorted(s for s in stems if s not in spelled)
    if unknown:
        raise ValueError(f"kohya module names that spell no layer of Krea 2's transformer: {unknown[:5]}")
    return {s: spelled[s] for s in stems}


def _as_original(state_dict: Mapping[str, torch.Tensor], denoiser: Any) -> dict[str, torch.Tensor]:
    """kohya's factors and alphas as the `lora_A` / `lora_B` under `diffusion_model.` diffusers reads."""
    stems: dict[str, dict[str, torch.Tensor]] = {}
    rest: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        suffix = next((s for s in (*_KOHYA, "lora_A.weight", "lora_B.weight") if name.endswith(f".{s}")), None)
        if suffix is None:
            rest[name] = tensor
        else:
            stems.setdefault(name.removesuffix(f".{suffix}"), {})[suffix] = tensor
    kohya = _kohya_stems({s for s in stems if s.startswith("lora_unet_")}, denoiser)
    out = dict(rest)
    for stem, parts in stems.items():
        down = parts.get("lora_down.weight", parts.get("lora_A.weight"))
        up = parts.get("lora_up.weight", parts.get("lora_B.weight"))
        if down is None or up is None:
            raise ValueError(f"{stem} has no down and up factor pair (it has {', '.join(sorted(parts))})")
        alpha = parts.get("alpha")
        if alpha is not None:
            down = down * (float(alpha.item()) / down.shape[0])
        name = f"diffusion_model.{kohya[stem]}" if stem in kohya else stem
        out[f"{name}.lora_A.weight"], out[f"{name}.lora_B.weight"] = down, up
    return out


def convert_lora(state_dict: dict[str, Any], denoiser: Any) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """diffusers' own conversion (`Krea2Pipeline.lora_state_dict`), after kohya's names and alphas (which it
    refuses) are put in the original names it reads. What it cannot read comes out as a ValueError (as every
    family's converter reports it), naming the tensors."""
    if any(name.endswith(_KOHYA) or name.startswith("lora_unet_") for name in state_dict):
        state_dict = _as_original(state_dict, denoiser)
    try:
        converted = Krea2Pipeline.lora_state_dict(dict(state_dict))
    except _CONVERTER_ERRORS as e:
        raise ValueError(f"diffusers' Krea 2 converter could not read it ({type(e).__name__}: {e})") from e
    return converted, None
