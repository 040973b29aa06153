"""diffusers' FLUX converter at any served width, for the families whose LoRAs it reads (FLUX.1, and Chroma, whose
pipelines load LoRAs through the same `FluxLoraLoaderMixin`). Kept apart from `engine.families.flux` so that a
family reusing it imports no other family's spec.

diffusers' kohya converter splits each single block's fused `linear1` factor at FLUX.1's widths (3072 x 3 + 12288)
and asserts they add up. On a transformer of other widths (a tiny one), each `linear1` up factor is first padded
with zero rows to those widths, its rows for q, k, v and the MLP placed at the offsets diffusers splits at, and
the four factors it gives are cropped back after: the split and its sparse test see exactly the factor they would
at real width, and zero rows change neither. At real width nothing is padded.

diffusers 0.42 reads BFL's names only with kohya's factor names (`lora_down`/`lora_up`): a file with BFL's names and
PEFT's `lora_A`/`lora_B` (the flow trainer's, ai-toolkit's Chroma files, ComfyUI's saves) passes its converter
unchanged, and its loader then finds no `transformer.` key and loads nothing, silently, on either pipeline. With
PEFT's `base_model.model.` prefix (fal's trainer) its fal-Kontext converter reads them only as a whole FLUX.1 [dev]
(19 and 38 blocks, 3072 wide, every modulation): on Chroma, which has no modulations, it raises KeyError. Those
factors are renamed first to ComfyUI's `diffusion_model.<layer>.lora_down`/`lora_up` form (`renamed_bfl_factors`),
which diffusers' converter splits as it splits kohya's: one renaming for both families, whose result equals
diffusers' reading of the same LoRA in its own names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engine.errors import IncompatibleLoraError
from engine.families.spec import Module, PipelineClass, Tensor

__all__ = ["REAL_LINEAR1", "convert_bfl_lora", "linear1_widths", "renamed_bfl_factors"]

# diffusers 0.42's kohya converter splits `linear1` into q, k, v and the MLP's input at these widths.
REAL_LINEAR1 = (3072, 3072, 3072, 12288)
_LINEAR1_UP = re.compile(
    r"^(?:lora_unet_single_blocks_(\d+)_linear1|diffusion_model\.single_blocks\.(\d+)\.linear1)\.lora_up\.weight$"
)
_LINEAR1_PARTS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
# BFL's names with PEFT's factor names, bare, with ComfyUI's `diffusion_model.` prefix or with PEFT's own
# `base_model.model.` (PEFT's state dict of a BFL model: fal's trainer): every top-level module of BFL's FLUX.1
# (blocks, embedders, final layer) and Chroma's modulation network, `distilled_guidance_layer`.
_PREFIX = r"^(?:diffusion_model\.|base_model\.model\.)?"
_BFL_PEFT = re.compile(
    _PREFIX + r"((?:double_blocks|single_blocks|distilled_guidance_layer|final_layer|img_in|txt_in"
    r"|time_in|vector_in|guidance_in)\..+)\.lora_([AB])\.weight$"
)
_ALPHA = re.compile(_PREFIX + r"(.+)\.alpha$")


def linear1_widths(denoiser: Module) -> tuple[int, int, int, int] | None:
    """The widths of q, k, v and the MLP's input a single block's fused `linear1` holds, read from the served
    transformer's modules (None when it has no single block)."""
    blocks = getattr(denoiser, "single_transformer_blocks", None)
    if not blocks:
        return None
    q, k, v, mlp = (int(blocks[0].get_submodule(part).out_features) for part in _LINEAR1_PARTS)
    return q, k, v, mlp


def renamed_bfl_factors(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """BFL-named `lora_A`/`lora_B` factors as ComfyUI's `diffusion_model.<layer>.lora_down`/`lora_up` (their
    `.alpha` beside them), the form diffusers' FLUX converter reads; a file with none comes back unchanged.
    Without `.alpha` a layer's scale is 1, as PEFT reads a file without alphas, and as diffusers' converter reads
    kohya factors without one."""
    stems = {m[1] for name in state_dict if (m := _BFL_PEFT.match(name))}
    if not stems:
        return state_dict
    renamed: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        if m := _BFL_PEFT.match(name):
            renamed[f"diffusion_model.{m[1]}.lora_{'down' if m[2] == 'A' else 'up'}.weight"] = tensor
        elif (a := _ALPHA.match(name)) and a[1] in stems:
            renamed[f"diffusion_model.{a[1]}.alpha"] = tensor
        else:
            renamed[name] = tensor
    return renamed


def convert_bfl_lora(
    pipeline_class: PipelineClass, label: str, state_dict: dict[str, Tensor], denoiser: Module
) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """`pipeline_class.lora_state_dict` (diffusers' FLUX converter), at the served transformer's widths, BFL's
    names with `lora_A`/`lora_B` renamed first (`renamed_bfl_factors`).

    A factor whose rows fit no served width is refused here (IncompatibleLoraError naming both shapes), never
    asserted on; what diffusers' converter cannot read comes out as a ValueError naming `label`'s converter."""
    widths = linear1_widths(denoiser)
    padded, crops = _pad_linear1(renamed_bfl_factors(state_dict), widths)
    try:
        converted, alphas = pipeline_class.lora_state_dict(padded, return_alphas=True)
    except (AssertionError, RuntimeError, NotImplementedError, TypeError, AttributeError) as e:
        raise ValueError(f"diffusers' {label} converter could not read it ({type(e).__name__}: {e})") from e
    for key, rows in crops.items():
        if key in converted:
            converted[key] = converted[key][:rows].contiguous()
    return converted, alphas


def _pad_linear1(
    state_dict: Mapping[str, Tensor], widths: tuple[int, int, int, int] | None
) -> tuple[dict[str, Tensor], dict[str, int]]:
    """The state dict with each kohya `linear1` up factor laid out at diffusers' widths, and the crops to undo."""
    padded = dict(state_dict)
    crops: dict[str, int] = {}
    for name, up in state_dict.items():
        match = _LINEAR1_UP.match(name)
        if match is None:
            continue
        if widths is None:
            raise IncompatibleLoraError(f"{name} adapts a single block's linear1; the served transformer has none")
        if up.ndim != 2 or up.shape[0] != sum(widths):
            raise IncompatibleLoraError(
                f"{name} has {up.shape[0] if up.ndim else 0} output rows; the served transformer's linear1 has "
                f"{sum(widths)} (q, k, v of {widths[0]} each and an MLP input of {widths[3]})"
            )
        if widths == REAL_LINEAR1:
            continue
        if any(w > real for w, real in zip(widths, REAL_LINEAR1, strict=True)):
            raise IncompatibleLoraError(f"{name}: the served linear1 widths {widths} exceed FLUX.1's {REAL_LINEAR1}")
        block = match[1] or match[2]
        laid = up.new_zeros((sum(REAL_LINEAR1), up.shape[1]))
        start = offset = 0
        for part, width, real in zip(_LINEAR1_PARTS, widths, REAL_LINEAR1, strict=True):
            laid[offset : offset + width] = up[start : start + width]
            crops[f"transformer.single_transformer_blocks.{block}.{part}.lora_B.weight"] = width
            start, offset = start + width, offset + real
        padded[name] = laid
    return padded, crops
