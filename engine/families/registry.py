"""The families a pool can serve: one line each, naming the module that declares it.

A pool serves one base model; the family of that base (from `lora_catalog.bases`) names a module here, whose
`FAMILY` (`engine.families.spec.FamilySpec`) says how its pipeline is loaded, which modules a LoRA may change,
its request defaults and size presets, how a LoRA made for it looks, its preview decoder and tiny builder.
Families the catalogue lists but no module declares (unknown ones) are not served; `family_spec` refuses
them with the served ones named. Modules are imported on first use: `engine.settings` reads the served list
here and must not import torch.

Adding a family: its module (`engine/families/<family>.py`), its tests, and one line in `_REGISTERED`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from engine.errors import SettingsError
from engine.families.spec import FamilySpec
from lora_catalog.bases import KNOWN_BASES, family_of_base
from lora_catalog.entries import Family

__all__ = ["SERVED_FAMILIES", "FamilySpec", "family_spec", "served_labels", "served_specs", "spec_for"]


@dataclass(frozen=True)
class _Registered:
    family: Family
    label: str
    module: str


_REGISTERED = (
    _Registered(Family.SDXL, "SDXL", "engine.families.sdxl"),
    _Registered(Family.SD15, "SD 1.5", "engine.families.sd15"),
    _Registered(Family.SD2, "SD 2.x", "engine.families.sd2"),
    _Registered(Family.FLUX, "FLUX.1", "engine.families.flux"),
    _Registered(Family.ZIMAGE, "Z-Image", "engine.families.zimage"),
)
_BY_FAMILY = {r.family: r for r in _REGISTERED}

SERVED_FAMILIES: tuple[Family, ...] = tuple(_BY_FAMILY)


def served_labels() -> str:
    """The served families in words, e.g. "SDXL, SD 1.5 or SD 2.x"."""
    labels = [r.label for r in _REGISTERED]
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} or {labels[-1]}"


def spec_for(family: Family) -> FamilySpec:
    """The spec a served family's module declares; ValueError names the served families otherwise."""
    registered = _BY_FAMILY.get(family)
    if registered is None:
        raise ValueError(f"no pool serves the {family} family; served: {', '.join(SERVED_FAMILIES)}")
    spec = importlib.import_module(registered.module).FAMILY
    if not isinstance(spec, FamilySpec) or spec.family is not family:
        raise TypeError(f"{registered.module}.FAMILY is not the FamilySpec of {family}")
    return spec


def served_specs() -> tuple[FamilySpec, ...]:
    return tuple(spec_for(family) for family in SERVED_FAMILIES)


def family_spec(base_model_id: str, *, setting: str = "BASE") -> FamilySpec:
    """The spec for a base repo id; SettingsError names the accepted bases when its family is not served."""
    family = family_of_base(base_model_id)
    if family not in _BY_FAMILY:
        accepted = ", ".join(b.repo_id for b in KNOWN_BASES if b.family in _BY_FAMILY)
        kind = "an unknown base" if family is Family.UNKNOWN else f"a {family} base, which is not served here"
        raise SettingsError(
            f"{setting}={base_model_id!r} is {kind}; accepted: a base of the {served_labels()} family "
            f"({accepted}, or their fine-tunes' series)"
        )
    return spec_for(family)
