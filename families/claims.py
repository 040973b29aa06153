"""The claims table's resolver: which family a LoRA's tensor names and widths, or a checkpoint name, point to.

Each family declares its own row (`FamilyIdentity.claims`, `Spellings.checkpoint_names`, and in the engine its
signature's shape rule and widths) and never names another family; the ranking is here, once:

- a name several rows claim counts for each of them, but a name a row declares its `own` (a layer no other
  architecture has) counts only for the rows declaring it so;
- by tensors (`rank_by_tensors`): a family whose shapes or declared widths rule the LoRA out is out; of the rest,
  those claiming the most names stay, and of those, the ones whose declared widths hold the LoRA's beat those
  declaring none (the pools' routing breaks what ties remain by what they serve);
- for labels (`label_from_names`) and checkpoint names (`family_from_checkpoint_name`), where several families'
  signs show: a spelling that contains another's is the more specific and wins, then the newest architecture
  (`FamilyIdentity.released`: a newer model's LoRA may carry an older one's part, never the reverse), then the
  registry's order.

What a LoRA declares (its card's base, its file's metadata) comes before all of these: `engine.families.origin`.
Torch-free, as the catalogue reads it too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from families import IDENTITIES
from families.identity import Family, FamilyIdentity

__all__ = ["TensorMatch", "family_from_checkpoint_name", "label_from_names", "name_counts", "rank_by_tensors"]

_ORDER = {family: index for index, family in enumerate(IDENTITIES)}


def _claimers(name: str, rows: Iterable[FamilyIdentity], *, labels: bool = False) -> list[Family]:
    """The families one lower-cased name counts for: those declaring it their own, else those claiming it."""
    rows = tuple(rows)
    owners = [r for r in rows if r.claims.own is not None and r.claims.own(name)]
    if labels:
        return [r.family for r in owners or rows if r.claims.labels is not None and r.claims.labels(name)]
    if owners:
        return [r.family for r in owners]
    return [r.family for r in rows if r.claims.names is not None and r.claims.names(name)]


def name_counts(names: Iterable[str], rows: Iterable[FamilyIdentity]) -> dict[Family, int]:
    """How many of the tensor `names` each of `rows`' families claims."""
    rows = tuple(rows)
    counts = dict.fromkeys((r.family for r in rows), 0)
    for name in names:
        for family in _claimers(name.lower(), rows):
            counts[family] += 1
    return counts


@dataclass(frozen=True)
class TensorMatch:
    """One family's match with a LoRA's tensors: the names it claims, whether its own shape rule rules the LoRA
    out, and what its declared widths say (True: they hold the LoRA's; False: they exclude them; None: it
    declares none, or the LoRA shows none)."""

    family: Family
    names: int
    ruled_out: bool = False
    widths: bool | None = None

    @property
    def fits(self) -> bool:
        """Neither its shape rule nor its widths rule the LoRA out."""
        return not self.ruled_out and self.widths is not False


def rank_by_tensors(matches: Iterable[TensorMatch]) -> tuple[Family, ...]:
    """The families a LoRA's tensors leave, best first (none when no family claims a name)."""
    left = [m for m in matches if m.fits]
    most = max((m.names for m in left), default=0)
    claimed = [m for m in left if most and m.names == most]
    by_width = [m for m in claimed if m.widths]
    return tuple(m.family for m in by_width or claimed)


def _newest(families: Iterable[Family]) -> Family | None:
    """The newest architecture of `families`; of two released in the same month, the first registered."""
    rows = [IDENTITIES[f] for f in families]
    return max(rows, key=lambda r: (r.released, -_ORDER[r.family])).family if rows else None


def label_from_names(names: Iterable[str]) -> Family | None:
    """The family the catalogue labels a file by its tensor names alone (rows' `labels`); None: no row's."""
    found: set[Family] = set()
    for name in names:
        found.update(_claimers(name.lower(), IDENTITIES.values(), labels=True))
    return _newest(found)


_CHECKPOINT_NAMES: Mapping[Family, re.Pattern[str]] = {
    r.family: re.compile(r.spellings.checkpoint_names) for r in IDENTITIES.values() if r.spellings.checkpoint_names
}


def family_from_checkpoint_name(model_name: str) -> Family | None:
    """The family a lower-cased checkpoint file name (`ss_sd_model_name`) names, a best-effort guess; None: none."""
    spans = {f: m.span() for f, p in _CHECKPOINT_NAMES.items() if (m := p.search(model_name))}

    def contained(span: tuple[int, int]) -> bool:
        return any(o != span and o[0] <= span[0] and span[1] <= o[1] for o in spans.values())

    return _newest(f for f, span in spans.items() if not contained(span))
