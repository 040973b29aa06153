"""Which served pool a LoRA belongs to, given its origin (`engine.families.origin.judge_origin`).

The origin says what the LoRA was made for and how that was found. A base its card declares picks the pool
serving exactly that base, else the first pool of that family; a family its metadata declares picks the first
pool of that family; a LoRA judged by its tensors goes to the first pool whose family its names leave and whose
widths (denoiser and text encoders) hold every width its factors show, and to none in particular when pools of
several families fit (a LoRA over BFL's blocks alone fits FLUX.1 and Chroma alike: their widths are equal). Several
LoRAs of one request must agree (`agreed_pool`); a LoRA that fits several families' pools goes where the request's
named base or its other LoRAs send it, and with neither the request is a 400 naming the pools it fits and how to
pick one (`routed`): no family is preferred for it by the order `MODELS` lists them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.errors import IncompatibleLoraError, InvalidRequestError, UnservedBaseError
from engine.families.origin import LoraOrigin
from engine.families.spec import Widths
from families import IDENTITIES
from lora_catalog.bases import family_of_base
from lora_catalog.entries import Family

__all__ = [
    "LoraOrigin",
    "PoolInfo",
    "Served",
    "agreed_pool",
    "described_pick",
    "named_pool",
    "pick_pool",
    "pool_of_base",
    "routed",
    "served_list",
]


@dataclass(frozen=True)
class PoolInfo:
    """What routing needs to know of a pool: its base, family and the widths a LoRA's factors must match."""

    base_model_id: str
    family: Family
    denoiser_dims: frozenset[int]
    text_dims: frozenset[int]

    @property
    def widths(self) -> Widths:
        return Widths(self.denoiser_dims, self.text_dims)


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
        if len({pools[i].family for i in candidates}) > 1:
            return None
        return candidates[0]
    if not candidates:
        fallback = _fallback(origin, pools)
        if fallback is not None:
            return fallback
        raise UnservedBaseError(
            f"{label} was made for {origin.describe()}, which no pool here serves; served: {served_list(pools)}"
        )
    return candidates[0]


def described_pick(label: str, origin: LoraOrigin, pools: Sequence[PoolInfo]) -> tuple[int | None, str]:
    """`pick_pool`, with what the LoRA is for in words (its declared bases, else the pool it fits, else the pools it
    fits alike, which `routed` names when nothing else picks one)."""
    index = pick_pool(label, origin, pools)
    if origin.bases:
        return index, origin.describe()
    if index is not None:
        return index, pools[index].base_model_id
    fitting = [p for p in pools if (not origin.families or p.family in origin.families) and _fits(origin, p)]
    return None, f"fits {served_list(fitting)} alike by its tensors"


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


def routed(
    pools: Sequence[Served], named: int | None, choices: Sequence[tuple[str, int | None, str]]
) -> tuple[int, str]:
    """The pool a request goes to and why: the one its LoRAs' choices (ref, pool or None, why) and its named base
    (`named_pool`'s index) agree on, else the default (0); a 400 where a LoRA fits several families' pools alike
    (its choice None) and nothing else picks one. The one decision, for this process's pools
    (`Pools.route`) and a cluster's (`serving.backends.serve`); only how a LoRA's pool is found differs."""
    index = agreed_pool(choices, (named, pools[named].base_model_id) if named is not None else None)
    # pick_pool decides nothing only for a LoRA that fits several families' pools alike.
    undecided = [(ref, why) for ref, pick, why in choices if pick is None]
    if index is None and undecided:
        ref, why = undecided[0]
        raise InvalidRequestError(
            f"LoRA {ref!r} {why} and declares no base model (no card base, metadata or layer tells them apart); "
            "accepted: a request naming the base to run it on (POST /models/<base>, the API's `base`, the UI's base "
            "menu), or a LoRA whose card or metadata names its base"
        )
    if index is None:
        return 0, "default pool"
    if named is not None and all(pick is None for _, pick, _ in choices):
        return index, "named base"
    return index, "LoRA's base"


def served_list(pools: Sequence[PoolInfo]) -> str:
    return ", ".join(f"{p.base_model_id} ({p.family})" for p in pools)


def _fallback(origin: LoraOrigin, pools: Sequence[PoolInfo]) -> int | None:
    """The first pool of the family the LoRA's families fall back to (`FamilyIdentity.falls_back_to`), if any:
    used only when no pool of their own is served (`engine.families.origin.check_origin` warns)."""
    wanted = {IDENTITIES[f].falls_back_to for f in origin.families if f in IDENTITIES} - {None}
    return next((i for i, p in enumerate(pools) if p.family in wanted), None)


def _fits(origin: LoraOrigin, pool: PoolInfo) -> bool:
    return origin.widths.within(pool.widths)


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
