"""Each base-model family's identity, in one torch-free place that the catalogue and the engine both read.

A family's identity (`FamilyIdentity`, in `families/<family>.py`) is its name, bases and their metadata spellings,
its row of the claims table (`Claims`: its own signs only; `families.claims` ranks the rows), Civitai labels and
model ids. `lora_catalog` reads it; the engine's `FamilySpec` holds it and adds how the pipelines load and run.
This package imports neither torch, `engine` nor `lora_catalog`.
Adding a family touches only `families/<family>.py`, its `Family` member (`families/identity.py`),
`engine/families/<family>.py` and its tests (docs/internals.md, "families/__init__.py").
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

from families.identity import Base, CivitaiLabel, Family, FamilyIdentity, Spellings

__all__ = [
    "IDENTITIES",
    "TINY_MODEL_IDS",
    "Base",
    "CivitaiLabel",
    "Family",
    "FamilyIdentity",
    "Spellings",
    "base_of",
    "identity_of",
    "labels",
    "siblings",
]


def _load(family: Family) -> FamilyIdentity:
    identity = importlib.import_module(f"families.{family.value}").IDENTITY
    if not isinstance(identity, FamilyIdentity) or identity.family is not family:
        raise TypeError(f"families.{family.value}.IDENTITY is not the FamilyIdentity of {family}")
    return identity


# Every registered family's identity, in `Family`'s order.
IDENTITIES: Mapping[Family, FamilyIdentity] = MappingProxyType({f: _load(f) for f in Family if f is not Family.UNKNOWN})
# The embedded random-weight pipelines' ids, each to the reference model whose family builds it.
TINY_MODEL_IDS: Mapping[str, str] = MappingProxyType({i.tiny_id: i.model_id for i in IDENTITIES.values() if i.tiny_id})


def identity_of(family: Family) -> FamilyIdentity:
    """A registered family's identity; ValueError names the registered families otherwise."""
    if family not in IDENTITIES:
        raise ValueError(f"{family!r} is no registered family; registered: {', '.join(IDENTITIES)}")
    return IDENTITIES[family]


def labels() -> str:
    """The registered families in words, e.g. "SDXL, SD 1.5 or SD 2.x"."""
    named = [i.label for i in IDENTITIES.values()]
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} or {named[-1]}"


# Every registered base by its lower-cased repo id.
_BASES: Mapping[str, Base] = MappingProxyType({b.repo_id.lower(): b for i in IDENTITIES.values() for b in i.bases})


def base_of(repo_id: str) -> Base | None:
    """The registered base of a repo id (any case); None for a fine-tune's or an unknown one."""
    return _BASES.get(repo_id.strip().lower())


def siblings(a: str, b: str) -> bool:
    """Two different registered bases one of which is a checkpoint of the other (`Base.checkpoint_of`), or both of
    one base: LoRAs of either run on the other with a note."""
    first, second = base_of(a), base_of(b)
    if first is None or second is None or first is second:
        return False
    root = {first.checkpoint_of or first.repo_id, second.checkpoint_of or second.repo_id}
    return len(root) == 1 and (first.checkpoint_of is not None or second.checkpoint_of is not None)
