"""Which family a LoRA was made for: the one judgement, from what it declares, then its file's evidence.

`judge_origin` weighs, in order: what its card and Hub tags declare (a base we know decides, and names the
exact bases), the kohya/ModelSpec metadata in its file (`lora_catalog.bases.family_from_metadata`), and
last its tensors, against each served family's row of the claims table (its identity's `Claims` and its
signature's shape rule and widths), ranked by `families.claims.rank_by_tensors`: families whose LoRAs share
every name, as SD 1.x and 2.x do, all stay, with the widths its factors show.
The file is read only when the card does not decide. Two consumers ask it: preparation
(`check_origin`: refuse a LoRA of another family, warn when it declares nothing) and pool routing
(`engine.pools.routing.pick_pool`: which served pool it belongs to).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from engine.errors import IncompatibleLoraError
from engine.families.registry import served_specs
from engine.families.spec import Shapes, Widths
from families import IDENTITIES, Base, base_of, siblings
from families.claims import TensorMatch, name_counts, rank_by_tensors
from lora_catalog.bases import base_from_metadata, family_from_metadata, family_of_base
from lora_catalog.civitai.bases import civitai_base_for
from lora_catalog.entries import Family

__all__ = [
    "FileEvidence",
    "LoraOrigin",
    "check_origin",
    "declared_bases_from_tags",
    "judge_origin",
    "made_for_sibling",
    "without_fallen_layers",
]

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
        return LoraOrigin(_checkpoint_named(bases, declared_family, read_file), (declared_family,), "card")
    known = tuple(dict.fromkeys(f for f in map(family_of_base, bases) if f is not Family.UNKNOWN))
    if known:
        return LoraOrigin(bases, known, "card")
    metadata, shapes = read_file()
    declared = family_from_metadata(metadata)
    # A refiner, SD3 and other architectures we do not know declare Family.UNKNOWN: their tensors still tell.
    if declared is not None and declared is not Family.UNKNOWN:
        named = base_from_metadata(metadata, declared)
        return LoraOrigin((named,) if named else (), (declared,), "metadata", unknown_bases=bases)
    return _by_tensors(shapes, bases)


def _checkpoint_named(bases: tuple[str, ...], family: Family, read_file: Callable[[], FileEvidence]) -> tuple[str, ...]:
    """A source's bases, or the checkpoint the file's metadata names where the source's group holds several
    (Civitai's one "Qwen" group: Qwen-Image and Qwen-Image-2512); only then is the file read."""
    groups = [civitai_base_for(base) for base in bases]
    if not any(group is not None and group.checkpoints for group in groups):
        return bases
    named = base_from_metadata(read_file()[0], family)
    return (named,) if named else bases


def _by_tensors(shapes: Shapes, unknown_bases: tuple[str, ...]) -> LoraOrigin:
    """The served families whose rows of the claims table fit the LoRA's tensors (`families.claims` ranks them),
    with the widths its factors show (the routing's tie-break)."""
    specs = served_specs()
    counts = name_counts(shapes, (s.identity for s in specs))
    widths = {s.family: s.signature.lora_widths(shapes) for s in specs}
    matches = [
        TensorMatch(
            s.family,
            counts[s.family],
            s.signature.rules_out is not None and s.signature.rules_out(shapes),
            s.signature.fits_widths(widths[s.family]),
        )
        for s in specs
    ]
    families = rank_by_tensors(matches)
    # Nothing claimed: the widths every family left could read.
    shown = [widths[f] for f in families or (m.family for m in matches if m.fits)]
    denoiser = frozenset().union(*(w.denoiser for w in shown))
    text = frozenset().union(*(w.text for w in shown))
    return LoraOrigin(
        _checkpoint_shown(shapes, families), families, "shapes", denoiser, text, unknown_bases=unknown_bases
    )


def _checkpoint_shown(shapes: Shapes, families: tuple[Family, ...]) -> tuple[str, ...]:
    """The checkpoint of its one family a LoRA's names show (`LoraSignature.checkpoint`: a layer only LTX-2.3 has),
    as a card's base would name it: routing picks that checkpoint's pool, and a sibling's pool runs it with a note."""
    specs = [s for s in served_specs() if s.family in families and s.signature.checkpoint is not None]
    if len(families) != 1 or not specs:
        return ()
    judge = specs[0].signature.checkpoint
    base = judge(shapes) if judge is not None else None
    return (base,) if base else ()


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
        "transformer it fits, without its own pipeline's conditioning"
    )
    logger.warning("%s", warning)
    return warning


def _sibling_note(label: str, origin: LoraOrigin, served_base: str) -> str | None:
    """The note for a LoRA of the served family made for a sibling checkpoint of the served base (`Base.
    checkpoint_of`: FLUX.1 [dev]'s on FLUX.1 Krea [dev], Qwen-Image's on 2512, Z-Image's base and Turbo both
    ways), or whose metadata or tensors cannot tell which sibling it was made for; None otherwise."""
    served = base_of(served_base)
    family = family_of_base(served_base)
    if served is None or family not in origin.families or family not in IDENTITIES:
        return None
    if any(base.lower() == served.repo_id.lower() for base in origin.bases):
        return None
    runs_on = f"it runs on {served.display_name} ({served.repo_id})"
    if made_for := made_for_sibling(origin, served_base):
        note = (
            f"{label} was made for {made_for.display_name} ({made_for.repo_id}); {runs_on}, a checkpoint of "
            "the same architecture and loader with other weights, so it may look different"
        )
    else:
        sibs = [b for b in IDENTITIES[family].bases if b is served or siblings(b.repo_id, served_base)]
        # Metadata naming only the family says nothing against the reference model; tensors never tell.
        quiet = origin.how == "metadata" and served.checkpoint_of is None
        if origin.bases or len(sibs) < 2 or origin.how == "card" or quiet:
            return None
        what = "tensors" if origin.how == "shapes" else "metadata"
        note = f"{label}: its {what} cannot tell {' from '.join(b.display_name for b in sibs)}; {runs_on}"
    logger.warning("%s", note)
    return note


def made_for_sibling(origin: LoraOrigin, served_base: str) -> Base | None:
    """The sibling checkpoint of `served_base` (`families.siblings`: Krea 2 Raw's on Turbo, FLUX.1 [dev]'s on
    FLUX.1 Krea [dev]) the LoRA was made for; None when it names the served base itself, or no sibling. The one
    judgement both the note (`check_origin`) and the settings a card recommends for that sibling (not used here:
    `engine.prepare.preparation`) follow."""
    if any(base.lower() == served_base.lower() for base in origin.bases):
        return None
    made_for = (base for base in map(base_of, origin.bases) if base is not None and siblings(base.repo_id, served_base))
    return next(made_for, None)


def check_origin(label: str, origin: LoraOrigin, served_base: str) -> str | None:
    """Raise `IncompatibleLoraError` for a LoRA of another family than `served_base`'s; return a warning when
    only its tensors vouch for it (names can rule a family out, but only guess at one), or when it was made for a
    sibling checkpoint of the served base (`_sibling_note`)."""
    served = family_of_base(served_base)
    accepted = f"this Space serves {served_base} ({served}); accepted: LoRAs for the {served} family"
    if fallback := _fallen_back(label, origin, served, served_base):
        return fallback
    note = _sibling_note(label, origin, served_base)
    if origin.how == "card":
        if served in origin.families:
            return note
        raise IncompatibleLoraError(
            f"{label} was made for {', '.join(origin.bases)} ({', '.join(sorted(origin.families))}); {accepted}"
        )
    if origin.families and served not in origin.families:
        named = f" (its card names {', '.join(origin.unknown_bases)})" if origin.unknown_bases else ""
        trained = " or ".join(origin.families)
        raise IncompatibleLoraError(f"{label} was trained for the {trained} family{named}; {accepted}")
    if origin.how == "metadata":
        return note
    warning = f"{label} declares no base model we know; it is judged by its tensors alone"
    if len(origin.families) > 1:
        # Architectures whose LoRAs share names and widths (FLUX.1's and Chroma's blocks): the pool may be the
        # other's, and the LoRA may fit it poorly.
        alike = " and ".join(IDENTITIES[f].label for f in origin.families if f in IDENTITIES)
        warning = f"{warning}, which fit {alike} alike"
    if note:
        warning = f"{warning}. {note}"
    logger.warning("%s", warning)
    return warning


def without_fallen_layers(
    label: str, origin: LoraOrigin, served_base: str, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, tuple[int, ...]], str | None]:
    """A fallen-back LoRA's tensors without those of its own family's own layers (`Claims.own`: Wan 2.1 I2V's
    image keys and values and image embedder, on a Wan 2.2 I2V-A14B pool), which the pool it falls back to lacks,
    and a warning counting the layers not applied. Dropped, as diffusers drops them (PEFT's "unexpected keys" on
    `load_lora_weights`), never refused; everything else still must fit. Unchanged, None: not fallen back."""
    served = family_of_base(served_base)
    fallen = [IDENTITIES[f] for f in origin.families if f in IDENTITIES and IDENTITIES[f].falls_back_to is served]
    owns = [i.claims.own for i in fallen if i.claims.own is not None and served not in origin.families]
    dropped = sorted(name for name in shapes if any(own(name.lower()) for own in owns))
    if not dropped:
        return dict(shapes), None
    # A layer's factors, alpha and full differences (its `.diff_b`; a norm's `.diff`) count as one layer.
    layers = sorted({re.sub(r"\.(lora_(a|b|up|down)\.weight|alpha|diff(_b|_m)?)$", "", n, flags=re.I) for n in dropped})
    named = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    warning = (
        f"{label}: {len(layers)} of its layers were not applied ({len(dropped)} tensors: {named}): {served_base} "
        "has no such layers (diffusers drops them too)"
    )
    logger.warning("%s", warning)
    return {name: shape for name, shape in shapes.items() if name not in dropped}, warning
