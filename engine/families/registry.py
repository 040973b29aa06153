"""The families a pool can serve: each registered family (`families.Family`) and the engine module declaring it.

A pool serves one base model; the family of that base (from `lora_catalog.bases`) names a module here,
`engine.families.<family>`, whose `FAMILY` (`engine.families.spec.FamilySpec`) holds the family's identity
(`families/<family>.py`) and says how its pipeline is loaded, which modules a LoRA may change, its request
defaults and size presets, how a LoRA made for it looks, its preview decoder and tiny builder. Families no
identity declares (unknown ones) are not served; `family_spec` refuses them with the served ones named.
Modules are imported on first use: `engine.settings` reads the served list here and must not import torch.

Adding a family: what it touches is listed in `families` (its docstring).
"""

from __future__ import annotations

import importlib

from engine.errors import SettingsError
from engine.families.spec import FamilySpec
from families import IDENTITIES, labels
from lora_catalog.bases import KNOWN_BASES, family_of_base
from lora_catalog.entries import Family

__all__ = ["SERVED_FAMILIES", "FamilySpec", "family_spec", "served_labels", "served_specs", "spec_for"]

SERVED_FAMILIES: tuple[Family, ...] = tuple(IDENTITIES)


def served_labels() -> str:
    """The served families in words, e.g. "SDXL, SD 1.5 or SD 2.x"."""
    return labels()


def spec_for(family: Family) -> FamilySpec:
    """The spec a served family's module declares; ValueError names the served families otherwise."""
    if family not in IDENTITIES:
        raise ValueError(f"no pool serves the {family} family; served: {', '.join(SERVED_FAMILIES)}")
    module = f"engine.families.{family.value}"
    spec = importlib.import_module(module).FAMILY
    if not isinstance(spec, FamilySpec) or spec.identity is not IDENTITIES[family]:
        raise TypeError(f"{module}.FAMILY is not the FamilySpec of {family}")
    return spec


def served_specs() -> tuple[FamilySpec, ...]:
    return tuple(spec_for(family) for family in SERVED_FAMILIES)


def family_spec(base_model_id: str, *, setting: str = "BASE") -> FamilySpec:
    """The spec for a base repo id; SettingsError names the accepted bases when its family is not served."""
    family = family_of_base(base_model_id)
    if family not in IDENTITIES:
        accepted = ", ".join(b.repo_id for b in KNOWN_BASES if b.family in IDENTITIES)
        kind = "an unknown base" if family is Family.UNKNOWN else f"a {family} base, which is not served here"
        raise SettingsError(
            f"{setting}={base_model_id!r} is {kind}; accepted: a base of the {served_labels()} family "
            f"({accepted}, or their fine-tunes' series)"
        )
    return spec_for(family)
