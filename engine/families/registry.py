"""The model families a pool can serve: each one's pipeline class, LoRA components and defaults.

A pool serves one base model; the family of that base (from `lora_catalog.bases`)
decides how its pipeline is loaded (from the class named here, never guessed from
file names), which of its modules a LoRA may change, and the request defaults and
size presets the UI offers. Families the catalogue lists but no pool can serve
(FLUX, unknown ones) are not here; `family_spec` refuses them with the served ones named.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

from engine.errors import SettingsError
from lora_catalog.bases import KNOWN_BASES, family_of_base
from lora_catalog.entries import Family

__all__ = ["FAMILIES", "FamilySpec", "family_spec", "served_families"]


@dataclass(frozen=True)
class FamilySpec:
    """How one family is loaded and what its requests default to."""

    family: Family
    label: str
    pipeline_class: type[StableDiffusionXLPipeline] | type[StableDiffusionPipeline]
    # Pipeline attributes a LoRA may change (kohya's `lora_te_` is SD 1.x/2.x's one text encoder).
    components: tuple[str, ...]
    # The native resolution the family was trained at; the served pipeline's own config wins when it differs.
    side: int
    steps: int
    guidance: float


FAMILIES: dict[Family, FamilySpec] = {
    Family.SDXL: FamilySpec(
        Family.SDXL, "SDXL", StableDiffusionXLPipeline, ("unet", "text_encoder", "text_encoder_2"), 1024, 25, 5.0
    ),
    Family.SD15: FamilySpec(Family.SD15, "SD 1.5", StableDiffusionPipeline, ("unet", "text_encoder"), 512, 25, 7.5),
    Family.SD2: FamilySpec(Family.SD2, "SD 2.x", StableDiffusionPipeline, ("unet", "text_encoder"), 768, 25, 7.5),
}


def served_families() -> tuple[Family, ...]:
    return tuple(FAMILIES)


def family_spec(base_model_id: str, *, setting: str = "BASE") -> FamilySpec:
    """The spec for a base repo id; SettingsError names the accepted bases when its family is not served."""
    family = family_of_base(base_model_id)
    spec = FAMILIES.get(family)
    if spec is None:
        accepted = ", ".join(b.repo_id for b in KNOWN_BASES if b.family in FAMILIES)
        kind = "an unknown base" if family is Family.UNKNOWN else f"a {family} base, which is not served here"
        raise SettingsError(
            f"{setting}={base_model_id!r} is {kind}; accepted: a base of the SDXL, SD 1.5 or SD 2.x family "
            f"({accepted}, or their fine-tunes' series)"
        )
    return spec
