"""A two-stage pool's LoRA files (Wan 2.2 A14B: a high-noise and a low-noise transformer): which stage a file is
for, and a pair of files as one LoRA.

A file goes to both stages unless its name or metadata says which in an explicit form (the family's
`FamilySpec.stage_of`: `lora_catalog.pairs`): then its layers on the other stage are dropped, and a warning kept
with the adapter (so a cache hit says it too) names the stage that gets nothing. A pair (a folder of two files)
is one adapter: each file restricted to its stage, one for each; halves for the same stage, or one for both, or of
different bases are refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.families.origin import LoraOrigin
from engine.formats.adapters import PreparedAdapter

__all__ = ["Half", "Stages"]

_NAMES = ("high", "low")


@dataclass(frozen=True)
class Half:
    """One prepared file of a LoRA, with its name and what it says about its base."""

    name: str
    adapter: PreparedAdapter
    origin: LoraOrigin
    metadata: Mapping[str, str]


@dataclass(frozen=True)
class Stages:
    """The second stage's weight indices (`TargetTable`) and the family's reading of a file's stage."""

    second: frozenset[int]
    stage_of: Callable[[str, Mapping[str, str]], int | None]

    def restrict(self, adapter: PreparedAdapter, stage: int) -> PreparedAdapter:
        """`adapter` with only its layers on `stage` (0: the first, 1: the second)."""
        keep = [(stage == 1) == (layer.target in self.second) for layer in adapter.layers]
        reach = tuple(r for r, k in zip(adapter.reach, keep, strict=True)) if adapter.reach else ()
        layers = tuple(layer for layer, k in zip(adapter.layers, keep, strict=True) if k)
        return dataclasses.replace(adapter, layers=layers, reach=reach)

    def one(self, label: str, half: Half) -> PreparedAdapter:
        """A single file: both stages, or the one its name or metadata names, with a warning naming the other."""
        stage = self.stage_of(half.name, half.metadata)
        if stage is None:
            return half.adapter
        kept, dropped = _NAMES[stage], _NAMES[1 - stage]
        where = "name" if self.stage_of(half.name, {}) is not None else "metadata"
        warning = (
            f"{label}: its {where} says it is a {kept}-noise file ({half.name}), so it runs on the {kept}-noise "
            f"transformer only; the {dropped}-noise stage gets nothing of it"
        )
        adapter = self.restrict(half.adapter, stage)
        return dataclasses.replace(adapter, warnings=tuple(dict.fromkeys((*adapter.warnings, warning))))

    def pair(self, label: str, halves: Sequence[Half]) -> PreparedAdapter:
        """Two files as one adapter, each on its stage."""
        stages = [self.stage_of(h.name, h.metadata) for h in halves]
        if sorted(s for s in stages if s is not None) != [0, 1]:
            told = zip(halves, stages, strict=True)
            said = ", ".join(f"{h.name}: {'both' if s is None else _NAMES[s]}" for h, s in told)
            raise InvalidRequestError(
                f"{label} is a pair of files, but they are not one high-noise and one low-noise file ({said}); "
                "accepted: two files whose names say high_noise and low_noise (or, Wan2.2-Lightning's, HIGH and LOW)"
            )
        first, second = sorted(zip(stages, halves, strict=True), key=lambda item: item[0] or 0)
        _same_base(label, first[1], second[1])
        high, low = self.restrict(first[1].adapter, 0), self.restrict(second[1].adapter, 1)
        return dataclasses.replace(
            high,
            layers=high.layers + low.layers,
            reach=high.reach + low.reach if high.reach and low.reach else (),
            file_size=high.file_size + low.file_size,
            max_rank=max(high.max_rank, low.max_rank),
            components=tuple(dict.fromkeys(high.components + low.components)),
            warnings=tuple(dict.fromkeys(high.warnings + low.warnings)),
            file_hash=f"{high.file_hash}+{low.file_hash}",
            files=f"high: {first[1].name}, low: {second[1].name}",
        )


def _same_base(label: str, high: Half, low: Half) -> None:
    """Halves whose cards or metadata name bases of different families are refused, naming both."""
    told = ("card", "metadata")
    a, b = high.origin, low.origin
    if a.how in told and b.how in told and a.families and b.families and not set(a.families) & set(b.families):
        raise IncompatibleLoraError(
            f"{label}: its halves are of different bases ({high.name}: {', '.join(a.bases or a.families)}; "
            f"{low.name}: {', '.join(b.bases or b.families)}); accepted: a high-noise and a low-noise file of one base"
        )
