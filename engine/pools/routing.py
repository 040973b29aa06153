"""Which pool a LoRA belongs to: judged from what it declares, then its file's metadata, then its shapes.

The same evidence `engine.prepare.compat` checks, used the other way round: instead of
asking "does this LoRA fit the served base?", ask "which served base does it
fit?". A card's or tags' base decides first (an exact base repo id picks its
pool, else the family picks the first pool of that family); a file that
declares nothing is judged by its kohya/ModelSpec metadata, and a file without
that by its tensor names (which tell SDXL from SD 1.x/2.x) and shapes (the
cross-attention and text-encoder widths, which tell every family apart).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.errors import IncompatibleLoraError, InvalidRequestError, UnservedBaseError
from lora_catalog.bases import family_from_keys, family_from_metadata, family_of_base
from lora_catalog.entries import Family

__all__ = [
    "LoraOrigin",
    "PoolInfo",
    "Served",
    "agreed_pool",
    "declared_origin",
    "described_pick",
    "file_origin",
    "named_pool",
    "pick_pool",
    "pool_of_base",
    "served_list",
]

# Compared lower-cased.
_DOWN = (".lora_down.weight", ".lora_a.weight", ".down.weight", "_lora.down.weight")
# Names do not tell SD 1.x from SD 2.x; `family_from_keys` reports both as SD 1.5.
_NAME_FAMILIES = {Family.SD15: (Family.SD15, Family.SD2)}


@dataclass(frozen=True)
class PoolInfo:
    """What routing needs to know of a pool: its base, family and the widths a LoRA's factors must match."""

    base_model_id: str
    family: Family
    cross_attention_dims: frozenset[int]
    text_dims: frozenset[int]


@dataclass(frozen=True)
class LoraOrigin:
    """What one LoRA says about its base, and how that was found (`card`, `metadata`, `shapes`)."""

    bases: tuple[str, ...]
    families: tuple[Family, ...]
    how: str
    cross_attention_dims: frozenset[int] = frozenset()
    text_dims: frozenset[int] = frozenset()

    def describe(self) -> str:
        if self.bases:
            return ", ".join(self.bases)
        return "/".join(str(f) for f in self.families) + f" (from its {self.how})" if self.families else "unknown"


def declared_origin(declared_bases: Iterable[str]) -> LoraOrigin | None:
    """The origin a card or tags declare, or None when they name no base we know."""
    bases = tuple(dict.fromkeys(declared_bases))
    families = tuple(dict.fromkeys(f for f in map(family_of_base, bases) if f is not Family.UNKNOWN))
    return LoraOrigin(bases, families, "card") if families else None


def file_origin(metadata: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]) -> LoraOrigin:
    """The origin a file shows: its metadata's family, else its names' family narrowed by its shapes."""
    declared = family_from_metadata(metadata)
    if declared is not None and declared is not Family.UNKNOWN:
        return LoraOrigin((), (declared,), "metadata")
    guessed = family_from_keys(shapes)
    families = _NAME_FAMILIES.get(guessed, (guessed,)) if guessed is not None else ()
    cross, text = set(), set()
    for name, shape in shapes.items():
        lowered = name.lower()
        if not lowered.endswith(_DOWN) or len(shape) < 2:
            continue
        if "attn2" in lowered and ("to_k" in lowered or "to_v" in lowered):
            cross.add(int(shape[1]))
        elif lowered.startswith(("lora_te", "text_encoder", "te.", "te1.", "te2.")) and "q_proj" in lowered:
            text.add(int(shape[1]))
    return LoraOrigin((), families, "shapes", frozenset(cross), frozenset(text))


def pick_pool(label: str, origin: LoraOrigin, pools: Sequence[PoolInfo]) -> int | None:
    """The index of the pool `origin` belongs to; None when nothing tells; raises when no served pool fits."""
    for base in origin.bases:
        for index, pool in enumerate(pools):
            if pool.base_model_id.lower() == base.lower():
                return index
    candidates = [i for i, p in enumerate(pools) if not origin.families or p.family in origin.families]
    if origin.how == "shapes":
        candidates = [i for i in candidates if _fits(origin, pools[i])]
        if not candidates:
            raise IncompatibleLoraError(
                f"{label} fits none of the served bases by its tensor shapes; served: {served_list(pools)}"
            )
        if not origin.families and len({pools[i].family for i in candidates}) > 1:
            return None
        return candidates[0]
    if not candidates:
        raise UnservedBaseError(
            f"{label} was made for {origin.describe()}, which no pool here serves; served: {served_list(pools)}"
        )
    return candidates[0]


def described_pick(label: str, origin: LoraOrigin, pools: Sequence[PoolInfo]) -> tuple[int | None, str]:
    """`pick_pool`, with what the LoRA is for in words (its declared bases, else the pool it fits)."""
    index = pick_pool(label, origin, pools)
    if origin.bases:
        return index, origin.describe()
    return index, pools[index].base_model_id if index is not None else "an undetermined base"


def agreed_pool(choices: Sequence[tuple[str, int | None, str]], named: tuple[int, str] | None = None) -> int | None:
    """The one pool a request's LoRAs (ref, pool index or None, why) and its named base (index, id) agree on.

    None when nothing decided; a 400 naming each LoRA's base when they pick different pools.
    """
    decided = {index for _, index, _ in choices if index is not None}
    if named is not None:
        decided.add(named[0])
    if len(decided) > 1:
        parts = [f"{ref!r} is for {why}" for ref, index, why in choices if index is not None]
        if named is not None:
            parts.append(f"the request names {named[1]}")
        raise InvalidRequestError(
            f"the LoRAs of one request must share one base model, but {'; '.join(parts)}; "
            "accepted: LoRAs of one base per request"
        )
    return decided.pop() if decided else None


def served_list(pools: Sequence[PoolInfo]) -> str:
    return ", ".join(f"{p.base_model_id} ({p.family})" for p in pools)


def _fits(origin: LoraOrigin, pool: PoolInfo) -> bool:
    return origin.cross_attention_dims <= pool.cross_attention_dims and origin.text_dims <= pool.text_dims


class Served(Protocol):
    """What the base lookups need of a pool, wherever it is listed (`Pools`, the UI's `ServedPool`, the cluster)."""

    @property
    def base_model_id(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def family(self) -> str: ...


def named_pool(pools: Sequence[Served], base: str) -> int:
    """The index of the pool a request names by `base` (its base or model repo id, any case); a 404 naming the
    served ones otherwise. The one lookup of a named base, for the pools, the UI and the cluster's ingress."""
    wanted = base.strip().lower()
    for index, pool in enumerate(pools):
        if wanted in (pool.base_model_id.lower(), pool.model_id.lower()):
            return index
    served = ", ".join(f"{p.base_model_id} ({p.family})" for p in pools)
    raise UnservedBaseError(f"base model {base!r} is not served here; served: {served}")


def pool_of_base(pools: Sequence[Served], base: str) -> int | None:
    """The index of the pool LoRAs made for `base` run on: the base's own pool, else the first of its family
    (as routing picks for a LoRA whose card names `base`); None when no pool serves its family."""
    wanted = base.strip().lower()
    own = next((i for i, p in enumerate(pools) if p.base_model_id.lower() == wanted), None)
    if own is not None:
        return own
    family = family_of_base(base)
    return next((i for i, p in enumerate(pools) if p.family == family), None)
