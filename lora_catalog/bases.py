"""Known base models and how to tell which family a LoRA was trained for, read from the families' identities.

A LoRA only fits a base of its own family (SDXL LoRAs fit SDXL fine-tunes, not SD 1.5 ones). Each family's
bases, metadata spellings and tensor-name claims are declared once, in `families/<family>.py`; this module turns
them into the catalogue's lookups (`families.claims` ranks the claims). Architectures that look alike but take
none of a family's LoRAs (the SDXL refiner, SD 3) come out as `Family.UNKNOWN`, as do bases no family lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from families import IDENTITIES
from families.claims import family_from_checkpoint_name, label_from_names

from .entries import Family

__all__ = [
    "DEFAULT_BASE",
    "KNOWN_BASES",
    "KnownBase",
    "base_from_metadata",
    "family_from_keys",
    "family_from_metadata",
    "family_of_base",
]


@dataclass(frozen=True)
class KnownBase:
    """A base model the UI can offer in its base filter."""

    repo_id: str
    display_name: str
    family: Family


# The first registered family's reference model: the default family's (`families.Family`).
DEFAULT_BASE = next(iter(IDENTITIES.values())).model_id
KNOWN_BASES: tuple[KnownBase, ...] = tuple(
    KnownBase(b.repo_id, b.display_name, i.family) for i in IDENTITIES.values() for b in i.bases
)
_BY_ID: dict[str, Family] = {b.repo_id.lower(): b.family for b in KNOWN_BASES}
_SERIES: tuple[tuple[str, Family], ...] = tuple((p, i.family) for i in IDENTITIES.values() for p in i.series)

# Look-alikes no family's LoRA fits: the SDXL refiner is a separate, incompatible net; SD 3 is no family here.
# Matched by longest prefix with the families' spellings, so the refiner's beats SDXL's.
_OTHER_ARCHITECTURES = ("stable-diffusion-xl-v1-refiner", "stable-diffusion-v3", "stable-diffusion-3")
_OTHER_VERSIONS = ("sd3",)
# modelspec.architecture prefixes (Stability's ModelSpec) and kohya's `ss_base_model_version` values (sd-scripts
# library/sai_model_spec.py and train_util.py), each family's and the look-alikes'.
_ARCHITECTURES: tuple[tuple[str, Family], ...] = (
    *((p, i.family) for i in IDENTITIES.values() for p in i.spellings.architectures),
    *((p, Family.UNKNOWN) for p in _OTHER_ARCHITECTURES),
)
_SS_VERSIONS: tuple[tuple[str, Family], ...] = (
    *((p, i.family) for i in IDENTITIES.values() for p in i.spellings.kohya_versions),
    *((p, Family.UNKNOWN) for p in _OTHER_VERSIONS),
)
_KOHYA_V2 = tuple(i.family for i in IDENTITIES.values() if i.spellings.kohya_v2)


def _longest_prefix(value: str, table: Iterable[tuple[str, Family]]) -> Family | None:
    matches = [(len(prefix), family) for prefix, family in table if value.startswith(prefix)]
    return max(matches, key=lambda m: m[0])[1] if matches else None


def family_of_base(repo_id: str) -> Family:
    """The family of a base model repo id (case-insensitive); `Family.UNKNOWN` when not in the table."""
    key = repo_id.strip().lower()
    if key in _BY_ID:
        return _BY_ID[key]
    for prefix, family in _SERIES:
        if key.startswith(prefix):
            return family
    return Family.UNKNOWN


def family_from_metadata(metadata: Mapping[str, str]) -> Family | None:
    """The family a safetensors file declares in its kohya/ModelSpec metadata; None when it declares none."""
    architecture = str(metadata.get("modelspec.architecture", "")).strip().lower()
    if architecture and (found := _longest_prefix(architecture, _ARCHITECTURES)) is not None:
        return found
    version = str(metadata.get("ss_base_model_version", "")).strip().lower()
    if version and (found := _longest_prefix(version, _SS_VERSIONS)) is not None:
        return found
    if str(metadata.get("ss_v2", "")).strip().lower() == "true" and _KOHYA_V2:
        return _KOHYA_V2[0]
    # Checkpoint file names as trainers record them: a best-effort guess (`families.claims` ranks the matches).
    model_name = str(metadata.get("ss_sd_model_name", "")).strip().lower()
    return family_from_checkpoint_name(model_name) if model_name else None


# The metadata fields that may name a checkpoint, not only its family (`Base.names`).
_CHECKPOINT_FIELDS = ("modelspec.architecture", "ss_base_model_version", "ss_sd_model_name")


def base_from_metadata(metadata: Mapping[str, str], family: Family) -> str | None:
    """The base of `family` a file's metadata names (FLUX.1 Krea [dev], Qwen-Image-2512: `Base.names`); None when
    it names only the family, or nothing."""
    if family not in IDENTITIES:
        return None
    fields = [str(metadata.get(key, "")).strip().lower() for key in _CHECKPOINT_FIELDS]
    for base in IDENTITIES[family].bases:
        if base.names is not None and any(re.search(base.names, field) for field in fields if field):
            return base.repo_id
    return None


def family_from_keys(tensor_names: Iterable[str]) -> Family | None:
    """Guess the family from tensor names alone (kohya and diffusers layouts); None when nothing matches.

    The catalogue's label for a local file it lists (families no pool serves included), from each family's
    `Claims.labels`, ranked by `families.claims`; whether a LoRA fits a served base is judged by the engine
    (`engine.families.origin`), from their widths too. SD 1.x and SD 2.x LoRAs share their tensor names (only
    shapes differ): only SD 1.x's row labels by them.
    """
    return label_from_names(tensor_names)
