"""From a LoRA file's tensor names to the pipeline modules they change.

Plain low-rank factors go through diffusers' own conversion (the family's `FamilySpec.convert_lora`, a
pipeline class's `lora_state_dict`, for kohya/SGM/XLabs names and alphas; its state-dict utilities for PEFT
names). diffusers has no converter for LyCORIS tensors, and drops kohya's `dora_scale`; their modules are
named here the same way: each kohya name (`lora_unet_input_blocks_4_1_…`) is passed through that conversion
once as a placeholder pair of factors, so it lands on exactly the module a plain LoRA of that name would.
Which components there are, and which is the denoiser, is the served family's (`TargetTable`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.utils.state_dict_utils import (
    convert_state_dict_to_diffusers,
    convert_state_dict_to_peft,
    convert_unet_state_dict_to_peft,
)

from engine.errors import IncompatibleLoraError
from engine.formats.lycoris import LYCORIS_PARAMS

__all__ = ["Convert", "SplitTensors", "component_state_dict", "kohya_modules", "peft_stem", "split_tensors"]

# A state dict in a file's names -> diffusers' names and network alphas (the served family's converter, bound
# to the served denoiser: `TargetTable.convert`).
Convert = Callable[[dict[str, torch.Tensor]], tuple[dict[str, torch.Tensor], Mapping[str, Any] | None]]
_KOHYA_PREFIXES = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")
# Names a module's tensors end with; longest first, so `lora_mid.weight` is not read as `weight`.
_MODULE_PARAMS = (*LYCORIS_PARAMS, "lora_down.weight", "lora_up.weight", "alpha", "dora_scale")
_MAGNITUDE = re.compile(r"^(?P<stem>.+)\.lora_magnitude_vector(\.weight)?$")


@dataclass(frozen=True)
class SplitTensors:
    """A file's tensors by what reads them: diffusers (plain factors), LyCORIS modules, DoRA magnitudes."""

    plain: dict[str, torch.Tensor] = field(default_factory=dict)
    lycoris: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # stem -> param -> tensor
    kohya_magnitudes: dict[str, torch.Tensor] = field(default_factory=dict)  # stem -> dora_scale
    peft_magnitudes: dict[str, torch.Tensor] = field(default_factory=dict)  # stem -> lora_magnitude_vector


def _split_name(name: str) -> tuple[str, str] | None:
    for param in sorted(_MODULE_PARAMS, key=len, reverse=True):
        if name.endswith(f".{param}"):
            return name[: -len(param) - 1], param
    return None


def split_tensors(tensors: Mapping[str, torch.Tensor]) -> SplitTensors:
    """Group LyCORIS modules (every tensor of a module with a `hada_`, `lokr_` or `lora_mid` tensor) and magnitudes."""
    named = {name: parts for name in tensors if (parts := _split_name(name)) is not None}
    lycoris_stems = {stem for stem, param in named.values() if param in LYCORIS_PARAMS}
    split = SplitTensors()
    for name, tensor in tensors.items():
        stem, param = named.get(name, (None, None))
        if stem in lycoris_stems and param is not None:
            split.lycoris.setdefault(stem, {})[param] = tensor
        elif param == "dora_scale" and stem is not None:
            split.kohya_magnitudes[stem] = tensor
        elif match := _MAGNITUDE.match(name):
            split.peft_magnitudes[match["stem"]] = tensor
        else:
            split.plain[name] = tensor
    return split


def component_state_dict(
    state_dict: Mapping[str, torch.Tensor], component: str, *, denoiser: bool
) -> dict[str, torch.Tensor]:
    """One component's part of diffusers' converted state dict, in PEFT names (`<module>.lora_A.weight`);
    `denoiser`: the component is the pipeline's denoiser (diffusers' older names differ from a text encoder's)."""
    prefix = f"{component}."
    part = {k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)}
    if not part:
        return part
    if denoiser:
        return part if any("lora_A" in k for k in part) else convert_unet_state_dict_to_peft(part)
    if any("lora_A" in k for k in part):
        return part
    return convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))


def is_kohya(stem: str) -> bool:
    return stem.startswith(_KOHYA_PREFIXES) and "." not in stem


def kohya_modules(
    stems: Sequence[str], convert: Convert, components: Sequence[str], denoiser: str, label: str
) -> dict[str, tuple[str, str]]:
    """(component, module) for each kohya module name, found by diffusers' conversion of a placeholder LoRA.

    `convert` is the served family's converter (`TargetTable.convert`), which knows its names; `components` the
    served pipeline's adaptable components, `denoiser` the one that is its denoiser.
    """
    if not stems:
        return {}
    placeholders: dict[str, torch.Tensor] = {}
    for index, stem in enumerate(stems):
        marker = torch.full((1, 1), float(index))  # exact in float32 far beyond any module count
        placeholders[f"{stem}.lora_down.weight"] = marker
        placeholders[f"{stem}.lora_up.weight"] = marker.clone()
    try:
        state_dict, _ = convert(placeholders)
    except IncompatibleLoraError as e:
        raise IncompatibleLoraError(f"{label}: {e}") from e
    except (ValueError, KeyError, IndexError) as e:
        raise IncompatibleLoraError(f"{label} has module names the served pipeline does not know: {e}") from e
    found: dict[str, tuple[str, str]] = {}
    for component in components:
        for key, marker in component_state_dict(state_dict, component, denoiser=component == denoiser).items():
            if key.endswith(".lora_A.weight"):
                found[stems[int(marker.item())]] = (component, key.removesuffix(".lora_A.weight"))
    missing = [stem for stem in stems if stem not in found]
    if missing:
        raise IncompatibleLoraError(f"{label} has module names the served pipeline does not know: {missing[:5]}")
    return found


def peft_stem(stem: str, components: Sequence[str]) -> list[tuple[str, str]]:
    """Candidate (component, module) pairs for `<component>.<m>` (`unet.<m>`, `transformer.<m>`,
    `text_encoder.<m>`, ...) or `base_model.model.<m>`, among the served `components`."""
    if stem.startswith("base_model.model."):
        module = stem.removeprefix("base_model.model.")
        return [(component, module) for component in components]
    component, _, module = stem.partition(".")
    return [(component, module)] if component in components and module else []
