"""Which family a LoRA was made for: the one judgement, from what it declares, then its file's evidence.

`judge_origin` weighs, in order: what its card and Hub tags declare (a base we know decides, and names the
exact bases), the kohya/ModelSpec metadata in its file (`lora_catalog.bases.family_from_metadata`), and
last its tensors: the served families whose signature claims the most of its names (`FamilySpec.signature`,
among those its factors' shapes do not rule out;
families whose LoRAs share every name, as SD 1.x and 2.x do, all stay; a name several families write, as
kohya's `lora_te1_` for SDXL's and FLUX's CLIP-L, does not outvote the transformer's or UNet's names around
it), with the widths its factors show.
The file is read only when the card does not decide. Two consumers ask it: preparation
(`check_origin`: refuse a LoRA of another family, warn when it declares nothing) and pool routing
(`engine.pools.routing.pick_pool`: which served pool it belongs to).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from engine.errors import IncompatibleLoraError
from engine.families.registry import served_specs
from engine.families.spec import Shapes, Widths
from families import IDENTITIES
from lora_catalog.bases import family_from_metadata, family_of_base
from lora_catalog.entries import Family

__all__ = ["FileEvidence", "LoraOrigin", "check_origin", "declared_bases_from_tags", "judge_origin"]

logger = logging.getLogger(__name__)

# What a LoRA file shows before it is loaded: its safetensors metadata, and its tensors' names and shapes.
FileEvidence = tuple[Mapping[str, str], Shapes]


@dataclass(frozen=True)
class LoraOrigin:
    """What one LoRA says about its base, and how that was found (`card`, `metadata`, `shapes`).

    `bases` are the bases its card declares when one is known (`card`); `families` the families the evidence
    leaves (several when it cannot tell them apart, none when it tells nothing); `unknown_bases` what its card
    names that we do not know (kept for messages); the widths are those its factors show (`shapes`).
    """

    bases: tuple[str, ...]
    families: tuple[Family, ...]
    how: str
    denoiser_dims: frozenset[int] = frozenset()
    text_dims: frozenset[int] = frozenset()
    unknown_bases: tuple[str, ...] = ()

    @property
    def widths(self) -> Widths:
        return Widths(self.denoiser_dims, self.text_dims)

    def describe(self) -> str:
        if self.bases:
            return ", ".join(self.bases)
        return "/".join(str(f) for f in self.families) + f" (from its {self.how})" if self.families else "unknown"


def declared_bases_from_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Bases named by Hub tags such as `base_model:adapter:<base>`."""
    bases = []
    for tag in tags:
        if tag.startswith("base_model:adapter:"):
            bases.append(tag.removeprefix("base_model:adapter:"))
        elif tag.startswith("base_model:") and tag.count(":") == 1:
            bases.append(tag.removeprefix("base_model:"))
    return tuple(dict.fromkeys(bases))


def judge_origin(
    declared_bases: Iterable[str], read_file: Callable[[], FileEvidence], *, declared_family: Family | None = None
) -> LoraOrigin:
    """The origin of a LoRA declaring `declared_bases` (card, tags); `read_file` is called only when they
    name no base we know, and gives the file's metadata and tensor shapes. A source that states the family
    itself (`declared_family`: Civitai's base label, UNKNOWN for a base no family of ours has) decides alone."""
    bases = tuple(dict.fromkeys(declared_bases))
    if declared_family is not None:
        return LoraOrigin(bases, (declared_family,), "card")
    known = tuple(dict.fromkeys(f for f in map(family_of_base, bases) if f is not Family.UNKNOWN))
    if known:
        return LoraOrigin(bases, known, "card")
    metadata, shapes = read_file()
    declared = family_from_metadata(metadata)
    # A refiner, SD3 and other architectures we do not know declare Family.UNKNOWN: their tensors still tell.
    if declared is not None and declared is not Family.UNKNOWN:
        return LoraOrigin((), (declared,), "metadata", unknown_bases=bases)
    # A family whose layers the factors' shapes cannot fit at any width is out before names are counted.
    specs = tuple(s for s in served_specs() if s.signature.rules_out is None or not s.signature.rules_out(shapes))
    names = [name.lower() for name in shapes]
    claims = {s.family: sum(map(s.signature.claims, names)) for s in specs}
    most = max(claims.values(), default=0)
    claimed = [s for s in specs if most and claims[s.family] == most]
    widths = [s.signature.lora_widths(shapes) for s in claimed or specs]
    denoiser = frozenset().union(*(w.denoiser for w in widths))
    text = frozenset().union(*(w.text for w in widths))
    families = tuple(dict.fromkeys(s.family for s in claimed))
    return LoraOrigin((), families, "shapes", denoiser, text, unknown_bases=bases)


def _fallen_back(label: str, origin: LoraOrigin, served: Family, served_base: str) -> str | None:
    """The warning for a LoRA running on the pool its family falls back to (`FamilyIdentity.falls_back_to`:
    routing sends it there only when no pool of its own is served); None when that is not the case."""
    if served in origin.families:
        return None
    fallen = [f for f in origin.families if f in IDENTITIES and IDENTITIES[f].falls_back_to is served]
    if not fallen:
        return None
    made_for = ", ".join(origin.bases) or IDENTITIES[fallen[0]].label
    warning = (
        f"{label} was made for {made_for}, which no pool here serves; it runs on {served_base} ({served}), whose "
        "transformer it fits, without its own pipeline's conditioning (one image)"
    )
    logger.warning("%s", warning)
    return warning


def check_origin(label: str, origin: LoraOrigin, served_base: str) -> str | None:
    """Raise `IncompatibleLoraError` for a LoRA of another family than `served_base`'s; return a warning when
    only its tensors vouch for it (names can rule a family out, but only guess at one)."""
    served = family_of_base(served_base)
    accepted = f"this Space serves {served_base} ({served}); accepted: LoRAs for the {served} family"
    if origin.how in ("card", "metadata") and (fallback := _fallen_back(label, origin, served, served_base)):
        return fallback
    if origin.how == "card":
        if served in origin.families:
            return None
        raise IncompatibleLoraError(
            f"{label} was made for {', '.join(origin.bases)} ({', '.join(sorted(origin.families))}); {accepted}"
        )
    if origin.families and served not in origin.families:
        named = f" (its card names {', '.join(origin.unknown_bases)})" if origin.unknown_bases else ""
        trained = " or ".join(origin.families)
        raise IncompatibleLoraError(f"{label} was trained for the {trained} family{named}; {accepted}")
    if origin.how == "metadata":
        return None
    warning = f"{label} declares no base model we know; it is judged by its tensors alone"
    logger.warning("%s", warning)
    return warning
