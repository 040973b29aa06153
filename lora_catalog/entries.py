"""One catalogue entry (`LoraEntry`); the base-model families it can belong to are `families.Family`'s."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from families import Family

from .errors import SnapshotError
from .hints import LoraHints

__all__ = ["Family", "LoraEntry", "Source", "parse_datetime"]

Source = Literal["hub", "local", "civitai"]
_SOURCES: tuple[str, ...] = ("hub", "local", "civitai")


@dataclass(frozen=True)
class LoraEntry:
    """What the catalogue knows about one LoRA; `ref` is the string the engine accepts."""

    ref: str
    repo_id: str | None
    title: str
    base_models: tuple[str, ...] = ()
    family: Family = Family.UNKNOWN
    trigger_words: tuple[str, ...] = ()
    preview_urls: tuple[str, ...] = ()
    license: str | None = None
    non_commercial: bool = False
    downloads: int = 0
    likes: int = 0
    trending_score: float = 0.0
    last_modified: datetime | None = None
    weight_name: str | None = None
    weight_size: int | None = None
    tags: tuple[str, ...] = ()
    sha: str | None = None
    source: Source = "hub"
    # The adapter variant the engine cannot fuse (e.g. "OFT"), read from the file header where one was read
    # (local files); None when the header showed a supported kind or was not read.
    unsupported: str | None = None
    # The pivotal-tuning embeddings file beside the weight file (lora_catalog.pivotal names the rule).
    embeddings_name: str | None = None
    embeddings_size: int | None = None
    # What it recommends for its use: a speed LoRA's sampler, steps and guidance, its card's (or Civitai page's)
    # settings, CLIP skip among them.
    hints: LoraHints = dataclasses.field(default_factory=LoraHints)
    # Where a person reads about it when it has no Hub repo (a Civitai model page).
    page_url: str | None = None
    # The LoRA strength its page recommends (Civitai's `strength`, `min_strength`, `max_strength`), shown with
    # its card; this Space does not apply it itself.
    recommended: tuple[tuple[str, float], ...] = ()
    # A video LoRA's preview videos (MP4s on the Hub's own host, its card's; `preview_urls` holds its stills).
    preview_videos: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (datetimes as ISO 8601 strings, tuples as lists)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, Family):
                value = value.value
            elif isinstance(value, LoraHints):
                value = value.to_json()
            if f.name == "recommended":
                value = dict(self.recommended)
            data[f.name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoraEntry:
        """Read what `to_json` wrote; unknown keys are ignored so newer snapshots still load."""
        if not isinstance(data, Mapping):
            raise SnapshotError(f"entry {data!r} is not a JSON object; accepted: an object with at least 'ref'")
        ref = data.get("ref")
        if not isinstance(ref, str) or not ref:
            raise SnapshotError(f"entry has ref={ref!r}; accepted: a non-empty string")
        source = data.get("source", "hub")
        if source not in _SOURCES:
            raise SnapshotError(f"entry {ref!r} has source={source!r}; accepted: {', '.join(_SOURCES)}")
        try:
            family = Family(data.get("family", Family.UNKNOWN.value))
        except ValueError:
            family = Family.UNKNOWN
        return cls(
            ref=ref,
            repo_id=_opt_str(data, "repo_id"),
            title=_opt_str(data, "title") or ref,
            base_models=_str_tuple(data, "base_models"),
            family=family,
            trigger_words=_str_tuple(data, "trigger_words"),
            preview_urls=_str_tuple(data, "preview_urls"),
            license=_opt_str(data, "license"),
            non_commercial=data.get("non_commercial") is True,
            downloads=_int(data, "downloads"),
            likes=_int(data, "likes"),
            trending_score=_float(data, "trending_score"),
            last_modified=parse_datetime(data.get("last_modified")),
            weight_name=_opt_str(data, "weight_name"),
            weight_size=_int(data, "weight_size") if data.get("weight_size") is not None else None,
            tags=_str_tuple(data, "tags"),
            sha=_opt_str(data, "sha"),
            source=source,
            unsupported=_opt_str(data, "unsupported"),
            embeddings_name=_opt_str(data, "embeddings_name"),
            embeddings_size=_int(data, "embeddings_size") if data.get("embeddings_size") is not None else None,
            hints=LoraHints.from_json(data.get("hints")),
            page_url=_opt_str(data, "page_url"),
            recommended=_numbers(data, "recommended"),
            preview_videos=_str_tuple(data, "preview_videos"),
        )


def parse_datetime(value: object) -> datetime | None:
    """An aware UTC datetime from an ISO 8601 string (the Hub's `...Z` included); None when unreadable."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _str_tuple(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if not isinstance(value, list | tuple):
        return ()
    return tuple(v for v in value if isinstance(v, str))


def _numbers(data: Mapping[str, Any], key: str) -> tuple[tuple[str, float], ...]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        return ()
    numbers = ((k, v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool))
    return tuple((str(k), float(v)) for k, v in numbers if math.isfinite(v))


def _int(data: Mapping[str, Any], key: str) -> int:
    value = _float(data, key)
    return int(value) if value >= 0 else 0


def _float(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    # bool is an int subclass; a flag where a count belongs is a bad value, not 1.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)
