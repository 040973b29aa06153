"""`HubSource`: LoRAs for a base model from the Hub's catalogue, and "use a custom LoRA" lookups.

Listing asks for every field an entry needs in the listing call itself
(`expand`), so a page of 100 LoRAs costs one request, never one per LoRA.
It does not go through `HfApi.list_models`: that call has no timeout and
retries a dead Hub five times with back-off (about 23 s), while the catalogue
must fail within `timeout_s` and fall back to its snapshot. Single-repo
lookups use `HfApi.model_info`, which honours a timeout and does not retry.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from cachetools import LRUCache
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    SafetensorsParsingError,
)
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from families import Family, identity_of

from .cards import choose_weight, entry_from_hub_item, resolve_url, weight_candidates
from .entries import LoraEntry
from .errors import (
    GatedLoraError,
    HubUnavailableError,
    InvalidRequestError,
    LoraNotFoundError,
)
from .hub_errors import hub_errors
from .pairs import SEPARATOR, choose_pair, split_pair
from .pivotal import embeddings_for
from .refs import is_commit_sha, validate_repo_id, validate_revision, validate_weight_name
from .sft_header import (
    DEFAULT_MAX_HEADER_BYTES,
    SafetensorsHeader,
    checked_header,
    declared_length,
    unparsed_header,
)
from .swr import StaleWhileRevalidate

__all__ = ["LIST_EXPAND", "SORTS", "HubSource", "Sort", "check_sort"]

logger = logging.getLogger(__name__)

Sort = Literal["downloads", "likes", "trending", "recent"]
SORTS: tuple[str, ...] = get_args(Sort)
_SORT_PARAM: Mapping[str, str] = {
    "downloads": "downloads",
    "likes": "likes",
    "trending": "trendingScore",
    "recent": "lastModified",
}
# Everything `entry_from_hub_item` reads, plus gated/private so such repos can be left out.
LIST_EXPAND: tuple[str, ...] = (
    "cardData",
    "siblings",
    "downloads",
    "likes",
    "trendingScore",
    "lastModified",
    "tags",
    "gated",
    "private",
    "sha",
)
_MAX_LIST_LIMIT = 10_000
_MAX_PAGE_SIZE = 1000  # the Hub's own cap per page
_CACHE_MAX = 1024
_LIBRARY_NAME, _LIBRARY_VERSION = "lora-switchboard", "0.1.0"


def check_sort(sort: str) -> Sort:
    if sort not in SORTS:
        raise InvalidRequestError(f"sort {sort!r} is not accepted; accepted: {', '.join(SORTS)}")
    return sort  # type: ignore[return-value]


_Key = tuple[str, str | None, str | None]


class HubSource:
    """The Hub (or a stand-in at `endpoint`) as a catalogue source; thread-safe."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        *,
        page_size: int = 100,
        cache_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not timeout_s > 0:
            raise InvalidRequestError(f"timeout_s={timeout_s!r} is not accepted; accepted: a number above 0")
        if not 1 <= page_size <= _MAX_PAGE_SIZE:
            raise InvalidRequestError(f"page_size={page_size!r} is not accepted; accepted: 1 to {_MAX_PAGE_SIZE}")
        # token=False keeps huggingface_hub from picking up a token saved on this machine: settings decide.
        self._token: str | bool = token or False
        self._api = HfApi(
            endpoint=endpoint, token=self._token, library_name=_LIBRARY_NAME, library_version=_LIBRARY_VERSION
        )
        self.endpoint: str = self._api.endpoint.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._page_size = page_size
        self._lock = threading.Lock()
        # Stale-while-revalidate: one background lookup at a time, never on a request's path.
        self._resolved: StaleWhileRevalidate[_Key, LoraEntry] = StaleWhileRevalidate(
            self._lookup, ttl_s=cache_ttl_s, name="hub", maxsize=_CACHE_MAX, clock=clock
        )
        # A commit sha never changes: entries resolved at one are never revalidated.
        self._at_commit: StaleWhileRevalidate[_Key, LoraEntry] = StaleWhileRevalidate(
            self._lookup, ttl_s=math.inf, name="hub-commit", maxsize=_CACHE_MAX, clock=clock
        )
        self._headers: LRUCache[tuple[str, str, str], SafetensorsHeader] = LRUCache(maxsize=_CACHE_MAX)

    def list_loras(
        self, base: str, *, search: str | None = None, sort: Sort = "downloads", limit: int = 100
    ) -> list[LoraEntry]:
        """Up to `limit` public, non-gated LoRAs whose card names `base`, best first by `sort`."""
        base = validate_repo_id(base, what="base model id")
        sort = check_sort(sort)
        search = search.strip() if search else None
        if not 1 <= limit <= _MAX_LIST_LIMIT:
            raise InvalidRequestError(f"limit={limit!r} is not accepted; accepted: 1 to {_MAX_LIST_LIMIT}")
        params: list[tuple[str, str]] = [
            ("filter", "lora"),
            ("filter", f"base_model:adapter:{base}"),
            ("sort", _SORT_PARAM[sort]),
            ("limit", str(min(self._page_size, limit))),
            *(("expand", name) for name in LIST_EXPAND),
        ]
        if search:
            params.append(("search", search))
        entries: list[LoraEntry] = []
        url: str | None = f"{self.endpoint}/api/models"
        query: list[tuple[str, str | int | float | bool | None]] | None = list(params) if params else None
        # Skipped (gated, private) items can leave pages short; this bounds the walk when most are skipped.
        pages_left = 2 * math.ceil(limit / self._page_size) + 1
        while url is not None and len(entries) < limit and pages_left > 0:
            pages_left -= 1
            with self._wrap(f"listing LoRAs for {base!r}"):
                response = get_session().get(url, params=query, headers=self._http_headers(), timeout=self.timeout_s)
                hf_raise_for_status(response)
                page = response.json()
            if not isinstance(page, list):
                raise HubUnavailableError(
                    f"the Hub at {self.endpoint} answered the listing with a JSON {type(page).__name__}, not a list"
                )
            entries += self._page_entries(page, base)
            # The next-page link carries every parameter, the cursor included.
            url, query = response.links.get("next", {}).get("url"), None
        return entries[:limit]

    def resolve(self, repo_id: str, revision: str | None = None, weight_name: str | None = None) -> LoraEntry:
        """The entry for a custom LoRA with `weight_name`, `weight_size` and `sha` filled; cached in memory.

        Past its TTL a cached entry is still answered at once (stale-while-revalidate, RFC 5861) while one
        background lookup refreshes it: a LoRA already resolved stays servable when the Hub is down, and
        `stale_warning` says so.
        """
        repo_id = validate_repo_id(repo_id)
        revision = validate_revision(revision)
        weight_name = validate_weight_name(weight_name)
        cache = self._at_commit if is_commit_sha(revision) else self._resolved
        return cache.get((repo_id, revision, weight_name))

    def stale_warning(self, repo_id: str, revision: str | None = None, weight_name: str | None = None) -> str | None:
        """Why the cached entry for these arguments is not fresh (past its TTL), or None when it is."""
        key = (repo_id, revision, weight_name)
        stale = self._resolved.stale(key)
        if stale is None:
            return None
        entry = self._resolved.peek(key)
        sha = entry.sha if entry is not None else None
        why = f"the Hub could not be reached ({stale.failure})" if stale.failure else "it is being revalidated"
        return (
            f"LoRA {repo_id!r} is served from Hub metadata {stale.age_s / 60:.0f} min old at revision "
            f"{(sha or '?')[:10]}: {why}"
        )

    def close(self) -> None:
        """Stop background revalidation (a lookup in progress finishes on its own)."""
        self._resolved.close()
        self._at_commit.close()

    def _lookup(self, key: _Key) -> LoraEntry:
        repo_id, revision, weight_name = key
        where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
        with self._wrap(f"looking up LoRA {where}", repo_id=repo_id, revision=revision):
            info = self._api.model_info(repo_id, revision=revision, files_metadata=True, timeout=self.timeout_s)
        if info.private:
            raise LoraNotFoundError(f"LoRA repo {repo_id!r} is private; this Space serves public LoRAs only")
        if info.gated:
            raise GatedLoraError(
                f"LoRA repo {repo_id!r} is gated ({info.gated}); this Space serves only LoRAs anyone can download"
            )
        try:
            entry = entry_from_hub_item(_info_to_item(info), endpoint=self.endpoint)
        except ValueError as e:
            raise HubUnavailableError(f"the Hub answered an unreadable record for {where}: {e}") from e
        sizes = {
            s.rfilename: s.size if s.size is not None else (s.lfs.size if s.lfs else None) for s in info.siblings or ()
        }
        # A repo of exactly a high- and a low-noise file is one LoRA of both only where its card's base may have two
        # stages (a two-stage family's, or none named): on another base such names are no stages, as on Civitai.
        implicit_pair = entry.family is Family.UNKNOWN or identity_of(entry.family).two_stage
        pair = choose_pair(where, weight_candidates(sizes), weight_name) if weight_name or implicit_pair else None
        if pair is not None:
            # Two files, one LoRA (`lora_catalog.pairs`): its weight name is both, its size their sum.
            halves = [sizes[name] for name in pair]
            total = None if None in halves else sum(size or 0 for size in halves)
            return dataclasses.replace(
                entry, weight_name=SEPARATOR.join(pair), weight_size=total, sha=info.sha or entry.sha
            )
        chosen = choose_weight(where, tuple(sizes), weight_name)
        embeddings = embeddings_for(chosen, sizes)
        size = sizes[embeddings] if embeddings else None
        entry = dataclasses.replace(entry, weight_name=chosen, weight_size=sizes[chosen], sha=info.sha or entry.sha)
        return dataclasses.replace(entry, embeddings_name=embeddings, embeddings_size=size)

    def read_remote_header(self, entry: LoraEntry) -> SafetensorsHeader:
        """The weight file's safetensors header, read with HTTP Range requests (no tensor data downloaded)."""
        repo_id = entry.repo_id
        if repo_id is None or entry.source != "hub":
            raise InvalidRequestError(f"{entry.ref!r} is not a Hub LoRA; accepted: an entry with a repo id")
        if entry.weight_name is None or entry.sha is None:
            entry = self.resolve(repo_id, entry.sha, entry.weight_name)
        sha, weight_name = entry.sha or "main", entry.weight_name or ""
        # A pair's header is its first (high-noise) file's.
        weight_name = (split_pair(weight_name) or (weight_name,))[0]
        key = (repo_id, sha, weight_name)
        with self._lock:
            if key in self._headers:
                return self._headers[key]
        url = resolve_url(self.endpoint, repo_id, sha, weight_name)
        label = f"{repo_id}/{weight_name}"
        what = f"reading the header of {label}"
        # The 8-byte prefix first: the header's length (where the data starts, which the library does not
        # say) and the file's size, both checked before the library reads the header itself.
        with self._wrap(what, repo_id=repo_id, revision=sha):
            prefix, total = self._read_prefix(url, 8)
        length = declared_length(prefix, label, total, DEFAULT_MAX_HEADER_BYTES)
        with self._wrap(what, repo_id=repo_id, revision=sha):
            try:
                parsed = self._api.parse_safetensors_file_metadata(
                    repo_id, weight_name, revision=sha, timeout=self.timeout_s
                )
            except (SafetensorsParsingError, AttributeError, TypeError) as e:
                raise unparsed_header(e, label) from e
        header = checked_header(parsed, header_size=length, file_size=total, label=label)
        with self._lock:
            self._headers[key] = header
        return header

    def _http_headers(self) -> dict[str, str]:
        return build_hf_headers(token=self._token, library_name=_LIBRARY_NAME, library_version=_LIBRARY_VERSION)

    def _read_prefix(self, url: str, count: int) -> tuple[bytes, int | None]:
        """The first `count` bytes of a file and its total size; stops early if the server ignores Range."""
        headers = {**self._http_headers(), "Range": f"bytes=0-{count - 1}"}
        with get_session().stream("GET", url, headers=headers, timeout=self.timeout_s) as response:
            if response.status_code == 416:
                return b"", 0
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            total = _total_size(response.headers)
            chunks: list[bytes] = []
            received = 0
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                received += len(chunk)
                if received >= count:
                    break
        return b"".join(chunks)[:count], total

    def _page_entries(self, page: list[Any], base: str) -> list[LoraEntry]:
        entries = []
        for item in page:
            if not isinstance(item, Mapping):
                logger.warning("skipping a listing item that is a JSON %s, not an object", type(item).__name__)
                continue
            if item.get("private") is True or item.get("gated") not in (False, None):
                continue
            try:
                entries.append(entry_from_hub_item(item, endpoint=self.endpoint, listed_base=base))
            except ValueError as e:
                logger.warning("skipping a listing item for %s: %s", base, e)
        return entries

    def _wrap(self, what: str, *, repo_id: str | None = None, revision: str | None = None):
        return hub_errors(what, endpoint=self.endpoint, timeout_s=self.timeout_s, repo_id=repo_id, revision=revision)


def _info_to_item(info: ModelInfo) -> dict[str, Any]:
    """`model_info`'s parsed answer back in the listing's JSON shape, so one parser serves both."""
    card = info.card_data.to_dict() if info.card_data is not None and hasattr(info.card_data, "to_dict") else None
    return {
        "id": info.id,
        "sha": info.sha,
        "cardData": card,
        "siblings": [{"rfilename": s.rfilename} for s in info.siblings or ()],
        "downloads": info.downloads,
        "likes": info.likes,
        "trendingScore": info.trending_score,
        "lastModified": info.last_modified,
        "tags": info.tags,
    }


def _total_size(headers: Mapping[str, str]) -> int | None:
    content_range = headers.get("content-range", "")
    if "/" in content_range and content_range.rsplit("/", 1)[1].strip().isdigit():
        return int(content_range.rsplit("/", 1)[1])
    if "content-range" not in headers and headers.get("content-length", "").isdigit():
        return int(headers["content-length"])
    return None
