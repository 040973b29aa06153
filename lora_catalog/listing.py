"""Pure helpers behind `Catalog.page`: base matching, local search and sort, freshness wording."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from .bases import family_of_base
from .entries import Family, LoraEntry

__all__ = [
    "CatalogPage",
    "Freshness",
    "FreshnessSource",
    "describe_age",
    "fits_base",
    "format_utc",
    "merge_by_ref",
    "search_entries",
    "sort_entries",
]

FreshnessSource = Literal["hub", "snapshot", "local", "none", "civitai"]
_EPOCH = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Freshness:
    """Where a page came from and how old it is; `message` is ready to show to a person."""

    source: FreshnessSource
    updated_at: datetime | None
    offline: bool
    message: str


@dataclass(frozen=True)
class CatalogPage:
    entries: tuple[LoraEntry, ...]
    page: int
    page_size: int
    total_known: int
    has_more: bool
    freshness: Freshness


def fits_base(entry: LoraEntry, base: str) -> bool:
    """Whether an entry belongs on the list for `base`: same family, or names that base when its family is unknown."""
    family = family_of_base(base)
    if family is not Family.UNKNOWN:
        return entry.family is family
    return base.lower() in (b.lower() for b in entry.base_models)


def search_entries(entries: Iterable[LoraEntry], search: str) -> list[LoraEntry]:
    """Case-insensitive substring search over ref, title, tags and trigger words (the Hub searches ids only)."""
    needle = search.strip().lower()
    if not needle:
        return list(entries)
    return [e for e in entries if any(needle in text.lower() for text in (e.ref, e.title, *e.tags, *e.trigger_words))]


def sort_entries(entries: Iterable[LoraEntry], sort: str) -> list[LoraEntry]:
    """Best first, like the Hub sorts; ties broken by ref so pages are stable."""
    by_ref = sorted(entries, key=lambda e: e.ref)
    if sort == "downloads":
        return sorted(by_ref, key=lambda e: e.downloads, reverse=True)
    if sort == "likes":
        return sorted(by_ref, key=lambda e: e.likes, reverse=True)
    if sort == "trending":
        return sorted(by_ref, key=lambda e: e.trending_score, reverse=True)
    return sorted(by_ref, key=lambda e: e.last_modified or _EPOCH, reverse=True)


def merge_by_ref(*lists: Sequence[LoraEntry]) -> list[LoraEntry]:
    """Entries of all lists once each; a later list's version of an entry wins, in first-seen order."""
    merged: dict[str, LoraEntry] = {}
    for entries in lists:
        for entry in entries:
            merged[entry.ref] = entry
    return list(merged.values())


def describe_age(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} days ago"


def format_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
