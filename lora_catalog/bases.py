"""Known base models and how to tell which family a LoRA was trained for, read from the families' identities.

A LoRA only fits a base of its own family (SDXL LoRAs fit SDXL fine-tunes, not SD 1.5 ones). Each family's
bases, metadata spellings and tensor-name claims are declared once, in `families/<family>.py`; this module
turns them into the catalogue's lookups. Architectures that look alike but take none of a family's LoRAs (the
SDXL refiner, SD 3) come out as `Family.UNKNOWN`, as do bases no family lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from families import IDENTITIES
from families.sdxl import ILLUSTRIOUS_BASE, NOOBAI_BASE, PONY_BASE
from families.sdxl import MODEL_ID as DEFAULT_BASE

from .entries import Family

__all__ = [
    "DEFAULT_BASE",
    "ILLUSTRIOUS_BASE",
    "KNOWN_BASES",
    "NOOBAI_BASE",
    "PONY_BASE",
    "KnownBase",
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


KNOWN_BASES: tuple[KnownBase, ...] = tuple(
    KnownBase(b.repo_id, b.display_name, i.family) for i in IDENTITIES.values() for b in i.bases
)
_BY_ID: dict[str, Family] = {b.repo_id.lower(): b.family for b in KNOWN_BASES}
_SERIES: tuple[tuple[str, Family], ...] = tuple((p, i.family) for i in IDENTITIES.values() for p in i.series)
# Where several families' signs show, the lowest precedence wins (`FamilyIdentity.precedence` says why).
_BY_PRECEDENCE = sorted(IDENTITIES.values(), key=lambda i: i.precedence)

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
# Checkpoint file names as trainers record them in `ss_sd_model_name`; a best-effort guess.
_MODEL_NAMES: tuple[tuple[re.Pattern[str], Family], ...] = tuple(
    (re.compile(i.spellings.checkpoint_names), i.family) for i in _BY_PRECEDENCE if i.spellings.checkpoint_names
)


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
    model_name = str(metadata.get("ss_sd_model_name", "")).strip().lower()
    if model_name:
        for pattern, family in _MODEL_NAMES:
            if pattern.search(model_name):
                return family
    return None


def family_from_keys(tensor_names: Iterable[str]) -> Family | None:
    """Guess the family from tensor names alone (kohya and diffusers layouts); None when nothing matches.

    The catalogue's label for a local file it lists (families no pool serves included); whether a LoRA fits a
    served base is judged by the engine's families (`engine.families.origin`), from their own signatures. SD 1.x
    and SD 2.x LoRAs share their tensor names (only shapes differ), so both come out as `Family.SD15` here.
    """
    labelling = [(i.family, i.label_claims) for i in _BY_PRECEDENCE if i.label_claims is not None]
    found: set[Family] = set()
    for raw in tensor_names:
        name = raw.lower()
        for family, claims in labelling:
            if claims(name):
                found.add(family)
                break
    return next((family for family, _ in labelling if family in found), None)
