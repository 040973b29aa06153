"""The catalogue's Civitai tab: LoRAs for a base model from `GET /api/v1/models?types=LORA&baseModels=...`.

A base of the filter (a Hub repo id) lists Civitai's labels that stand for it (`bases.civitai_base_for`) and,
for a family's own base, the fine-tunes whose LoRAs run on its pool (SDXL 1.0 with Pony, Illustrious and
NoobAI; each card says which). One request per (base, search, sort), up to `limit` LoRAs, cached like Hub lists:
fresh for `ttl_s`, then served stale while one background lookup refreshes it; when Civitai cannot be reached
the last list stays with a message saying so, and with none the page is empty and says why. The policy is the
resolver's (`CivitaiSource.list_loras`): non-LoRAs, early access and versions above the NSFW ceiling are left
out, and previews are only those rated within it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from families import base_of

from ..entries import LoraEntry
from ..errors import CivitaiUnavailableError
from ..listing import Freshness, describe_age, format_utc
from ..swr import StaleWhileRevalidate
from .bases import CIVITAI_BASES, CivitaiBase, civitai_base_for
from .source import CivitaiSource

__all__ = ["CivitaiListings", "labels_for"]

# The catalogue's sort orders as Civitai's (`sort`, `period`); "trending" is the week's most downloaded.
_SORTS = {
    "downloads": ("Most Downloaded", "AllTime"),
    "likes": ("Highest Rated", "AllTime"),
    "trending": ("Most Downloaded", "Week"),
    "recent": ("Newest", "AllTime"),
}

_Key = tuple[str, str, str]  # (base repo id, lower-cased search, sort)


@dataclass(frozen=True)
class _Listing:
    entries: tuple[LoraEntry, ...]
    updated_at: datetime


def labels_for(base: str) -> tuple[CivitaiBase, ...]:
    """Civitai's labels whose LoRAs the filter's `base` lists: its own, and its family's fine-tunes with it."""
    own = civitai_base_for(base)
    if own is None and (known := base_of(base)) is not None and known.checkpoint_of is not None:
        # A checkpoint with no group of its own (Qwen-Image-2512): its sibling's group, where that holds both.
        group = civitai_base_for(known.checkpoint_of)
        own = group if group is not None and group.checkpoints else None
    if own is None:
        # A base whose family's one group is named for its checkpoint (Civitai's "Krea 2": its trainer trains on
        # Raw, and the LoRAs run on Turbo, the pool most serve): that group, as the checkpoint lists it.
        own = next((b for b in CIVITAI_BASES if not b.finetune and _checkpoint_of(b.base_model_id) == base), None)
    if own is None:
        return ()
    finetunes = () if own.finetune else tuple(b for b in CIVITAI_BASES if b.finetune and b.family is own.family)
    return (own, *finetunes)


def _checkpoint_of(repo_id: str) -> str | None:
    """The base `repo_id` is a checkpoint of (`Base.checkpoint_of`), if any."""
    known = base_of(repo_id)
    return None if known is None else known.checkpoint_of


class CivitaiListings:
    """Civitai's LoRAs for a base, as the catalogue pages them; thread-safe."""

    def __init__(
        self,
        source: CivitaiSource,
        *,
        ttl_s: float = 300.0,
        limit: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._limit = limit
        self._cache: StaleWhileRevalidate[_Key, _Listing] = StaleWhileRevalidate(
            self._fetch, ttl_s=ttl_s, name="civitai-list", unavailable=CivitaiUnavailableError, clock=clock
        )

    def entries(self, base: str, search: str, sort: str) -> tuple[list[LoraEntry], Freshness]:
        """The list for `base` (searched and sorted as asked) and how fresh it is."""
        labels = labels_for(base)
        if not labels:
            served = ", ".join(b.label for b in CIVITAI_BASES if not b.finetune)
            message = f"Civitai lists no LoRAs this Space maps to {base}; its bases here: {served}"
            return [], Freshness("civitai", None, False, message)
        key = (base, search.strip().lower(), sort)
        try:
            listing = self._cache.get(key)
        except CivitaiUnavailableError as e:
            return [], Freshness("civitai", None, True, f"Offline: Civitai could not be reached ({e})")
        stale = self._cache.stale(key)
        # In Civitai's order: it searched (its full-text search) and sorted as asked.
        entries = list(listing.entries)
        names = " + ".join(b.label for b in labels)
        if stale is not None and stale.failure is not None:
            message = f"Offline: showing Civitai's {names} list of {format_utc(listing.updated_at)}"
            return entries, Freshness("civitai", listing.updated_at, True, message)
        age = describe_age((datetime.now(UTC) - listing.updated_at).total_seconds())
        return entries, Freshness("civitai", listing.updated_at, False, f"Live from Civitai ({names}), updated {age}")

    def close(self) -> None:
        self._cache.close()

    def _fetch(self, key: _Key) -> _Listing:
        base, search, sort = key
        civitai_sort, period = _SORTS.get(sort, _SORTS["downloads"])
        entries = self._source.list_loras(
            labels_for(base), search=search or None, sort=civitai_sort, period=period, limit=self._limit
        )
        return _Listing(tuple(entries), datetime.now(UTC))
