"""Civitai's `baseModel` labels and where their LoRAs run: the one mapping table (a test per entry).

Each label maps to the base repo id that stands for it (what routing and `MODELS` speak), its family and
whether it is a fine-tune of its family's base. SDXL-shaped fine-tunes (Pony, Illustrious, NoobAI) run on a
pool serving that fine-tune when `MODELS` has one (its BASE names the label's id), else on the family's first
pool, and the answer then says the LoRA runs on another checkpoint than it was trained for. Every other label
(SD 3.5, video models, ...) maps to nothing: such a LoRA gets the 404 naming the served bases.
"""

from __future__ import annotations

from dataclasses import dataclass

from families import IDENTITIES

from ..entries import Family

__all__ = ["CIVITAI_BASES", "CivitaiBase", "civitai_base", "civitai_base_for"]


@dataclass(frozen=True)
class CivitaiBase:
    """One of Civitai's `baseModel` labels, as routing reads it."""

    label: str
    base_model_id: str
    family: Family
    finetune: bool = False
    # Its family has a high-noise and a low-noise denoiser (`FamilyIdentity.two_stage`): a version may be a pair.
    two_stage: bool = False
    # The group holds its family's checkpoints of that base too (`CivitaiLabel.checkpoints`).
    checkpoints: bool = False


# Each family's labels (`FamilyIdentity.civitai`, as Civitai's API spells them: its BaseModel enum, e.g.
# "SDXL 1.0", "Flux.1 D" in developer.civitai.com/site/reference/models), oldest architecture first. Matched
# ignoring case.
CIVITAI_BASES: tuple[CivitaiBase, ...] = tuple(
    CivitaiBase(c.label, c.base_model_id, i.family, c.finetune, two_stage=i.two_stage, checkpoints=c.checkpoints)
    for i in sorted(IDENTITIES.values(), key=lambda i: i.released)
    for c in i.civitai
)
_BY_LABEL = {b.label.lower(): b for b in CIVITAI_BASES}
_BY_ID = {b.base_model_id.lower(): b for b in CIVITAI_BASES}


def civitai_base(label: str) -> CivitaiBase | None:
    """The table's entry for Civitai's `baseModel` label; None for a base this Space maps to no pool."""
    return _BY_LABEL.get(label.strip().lower())


def civitai_base_for(base_model_id: str) -> CivitaiBase | None:
    """The table's entry standing for a base repo id (the catalogue tab asks Civitai by label); None if none."""
    return _BY_ID.get(base_model_id.strip().lower())
