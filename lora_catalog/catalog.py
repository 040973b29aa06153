"""`Catalog`: the facade the UI pages through (Hub listing, snapshot and local folders in one list; Civitai
through its own source).

Stale-while-revalidate: a base's first page comes from the snapshot at once while the Hub is asked in the
background; a live list is kept `list_ttl_s`, then served stale while refreshed. When the Hub fails the last
good list stays on screen (`offline=True`) and the Hub is retried at most every `retry_after_s`. It blocks on
the Hub only for a query with no list of its own while the Hub answers, or on the very first call with no
snapshot, each wait bounded by the HubSource timeout.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from cachetools import LRUCache

from .civitai.listing import CivitaiListings
from .civitai.refs import parse_civitai
from .civitai.source import CivitaiSource
from .entries import LoraEntry
from .errors import (
    CatalogError,
    CivitaiUnavailableError,
    HubUnavailableError,
    InvalidRequestError,
    LoraNotFoundError,
    SnapshotError,
)
from .hub import HubSource, Sort, check_sort
from .listing import (
    CatalogPage,
    Freshness,
    describe_age,
    fits_base,
    format_utc,
    merge_by_ref,
    search_entries,
    sort_entries,
)
from .local import LocalIndex, LocalLora, scan_local_dirs
from .refs import is_local_ref, parse_local_ref, validate_repo_id
from .snapshot import Snapshot, read_snapshot, write_snapshot

__all__ = ["LISTING_SOURCES", "Catalog", "ListingSource", "check_listing_source"]

logger = logging.getLogger(__name__)

_Key = tuple[str, str, Sort]  # (base, lower-cased search, sort)
# Where a page's LoRAs come from: the Hub (with local folders and the snapshot), or Civitai's tab.
ListingSource = Literal["hub", "civitai"]
LISTING_SOURCES: tuple[str, ...] = ("hub", "civitai")


def check_listing_source(source: str) -> ListingSource:
    if source not in LISTING_SOURCES:
        raise InvalidRequestError(f"source {source!r} is not accepted; accepted: {', '.join(LISTING_SOURCES)}")
    return source  # type: ignore[return-value]


_MAX_LISTINGS = 64
_MAX_PAGE_SIZE = 200


@dataclass(frozen=True)
class _Listing:
    entries: tuple[LoraEntry, ...]
    fetched_at: float  # on the catalogue's clock, for ages and TTLs
    updated_at: datetime  # wall time, for people


class Catalog:
    """Pages of LoRAs for a base model; thread-safe, one background worker."""

    def __init__(
        self,
        hub: HubSource | None,
        *,
        snapshot_path: Path | None = None,
        local_dirs: Sequence[Path] = (),
        refresh: bool = True,
        list_limit: int = 300,
        list_ttl_s: float = 300.0,
        retry_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        civitai: CivitaiSource | None = None,
    ) -> None:
        if not 1 <= list_limit <= 10_000:
            raise InvalidRequestError(f"list_limit={list_limit!r} is not accepted; accepted: 1 to 10000")
        self._hub = hub
        self._civitai = civitai
        self._civitai_listings = CivitaiListings(civitai, ttl_s=list_ttl_s, clock=clock) if civitai else None
        self._refresh = refresh and hub is not None
        self._list_limit = list_limit
        self._ttl = list_ttl_s
        self._retry_after = retry_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._live: LRUCache[_Key, _Listing] = LRUCache(maxsize=_MAX_LISTINGS)
        self._pending: dict[_Key, concurrent.futures.Future[None]] = {}
        self._hub_state: Literal["unknown", "online", "offline"] = "unknown"
        self._failed_at: float | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._local_dirs = tuple(Path(d) for d in local_dirs)
        self._local: LocalIndex = scan_local_dirs(self._local_dirs)
        self._snapshot = _load_snapshot(snapshot_path)

    def page(
        self,
        base: str,
        *,
        search: str = "",
        sort: Sort = "downloads",
        page: int = 0,
        page_size: int = 24,
        source: ListingSource = "hub",
    ) -> CatalogPage:
        """One page of LoRAs for `base`: local ones first, then the Hub's (live, or the snapshot) by `sort`; or,
        with `source="civitai"`, Civitai's (`lora_catalog.civitai.listing`)."""
        base = validate_repo_id(base, what="base model id")
        sort = check_sort(sort)
        source = check_listing_source(source)
        search = (search or "").strip()
        if not isinstance(page, int) or page < 0:
            raise InvalidRequestError(f"page={page!r} is not accepted; accepted: an integer from 0")
        if not isinstance(page_size, int) or not 1 <= page_size <= _MAX_PAGE_SIZE:
            raise InvalidRequestError(f"page_size={page_size!r} is not accepted; accepted: 1 to {_MAX_PAGE_SIZE}")
        if source == "civitai":
            if self._civitai_listings is None:
                offline = Freshness("civitai", None, True, "This Space runs without Civitai")
                return _paged([], page, page_size, offline)
            listed, freshness = self._civitai_listings.entries(base, search, sort)
            return _paged(listed, page, page_size, freshness)
        key = (base, search.lower(), sort)
        hub_entries, freshness = self._hub_side(key, self._listing_for(key))
        local = sorted(search_entries((e for e in self._local.entries if fits_base(e, base)), search), key=_title)
        local_refs = {e.ref for e in local}
        entries = local + [e for e in hub_entries if e.ref not in local_refs]
        if freshness.source == "none" and local:
            message = (
                "Offline: no snapshot; showing local LoRAs only"
                if freshness.offline
                else "Loading the list from the Hub; showing local LoRAs meanwhile"
            )
            freshness = Freshness("local", None, freshness.offline, message)
        return _paged(entries, page, page_size, freshness)

    @property
    def civitai(self) -> CivitaiSource | None:
        """The Civitai source (None: this catalogue runs without Civitai)."""
        return self._civitai

    def resolve(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> LoraEntry:
        """The entry for a ref: `local:<path>` from the local folders, a Civitai reference (any form
        `lora_catalog.civitai.refs` reads) through Civitai, anything else through the Hub."""
        ref = ref.strip() if isinstance(ref, str) else ref
        civitai = parse_civitai(ref)
        if civitai is not None:
            if self._civitai is None:
                raise CivitaiUnavailableError(f"cannot look up {ref!r}: this Space runs without Civitai access")
            return self._civitai.entry(civitai)
        if isinstance(ref, str) and is_local_ref(ref):
            if revision is not None or weight_name is not None:
                raise InvalidRequestError(f"local LoRA {ref!r} takes no revision or weight_name; accepted: None")
            return self.local_lora(ref).entry
        if self._hub is None:
            raise HubUnavailableError(
                f"cannot look up {ref!r}: this catalogue runs without the Hub; accepted: a 'local:' ref"
            )
        return self._hub.resolve(ref, revision=revision, weight_name=weight_name)

    def stale_warning(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> str | None:
        """Why a Hub LoRA's cached metadata is served stale (the Hub is down, or it is being revalidated), or None."""
        civitai = parse_civitai(ref)
        if civitai is not None:
            return self._civitai.stale_warning(civitai) if self._civitai is not None else None
        if self._hub is None or is_local_ref(ref):
            return None
        return self._hub.stale_warning(ref, revision, weight_name)

    def local_lora(self, ref: str) -> LocalLora:
        """The local file behind a `local:` ref (see `LocalLora`)."""
        relative = parse_local_ref(ref)
        found = self._local.get(f"local:{relative.as_posix()}")
        if found is None:
            folders = ", ".join(str(d) for d in self._local_dirs) or "none configured"
            raise LoraNotFoundError(f"local LoRA {ref!r} was not found in the local LoRA folders ({folders})")
        return found

    def rescan_local(self) -> int:
        """Read the local folders again (after files were added); returns how many LoRAs they hold."""
        index = scan_local_dirs(self._local_dirs)
        with self._lock:
            self._local = index
        return len(index.by_ref)

    def refresh_now(self, base: str, *, search: str = "", sort: Sort = "downloads") -> tuple[LoraEntry, ...]:
        """Fetch the Hub list for `base` now (blocking); HubUnavailableError when it fails."""
        key = (validate_repo_id(base, what="base model id"), (search or "").strip().lower(), check_sort(sort))
        return self._fetch(key).entries

    def save_snapshot(self, path: Path, base: str) -> Snapshot:
        """Write the live Hub list for `base` (fetched now if there is none yet) as a snapshot file."""
        key: _Key = (validate_repo_id(base, what="base model id"), "", "downloads")
        with self._lock:
            listing = self._live.get(key)
        if listing is None:
            self.refresh_now(key[0])
            with self._lock:
                listing = self._live[key]
        snapshot = Snapshot.of(key[0], listing.updated_at, listing.entries)
        write_snapshot(Path(path), snapshot)
        return snapshot

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for background refreshes to finish; False if some still run after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                # Jobs remove themselves when they finish; only ones cancelled by close() linger.
                for key in [k for k, job in self._pending.items() if job.cancelled()]:
                    del self._pending[key]
                pending = list(self._pending.values())
            if not pending:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            concurrent.futures.wait(pending, timeout=remaining)

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if self._hub is not None:
            self._hub.close()
        if self._civitai_listings is not None:
            self._civitai_listings.close()
        if self._civitai is not None:
            self._civitai.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _listing_for(self, key: _Key) -> _Listing | None:
        """The live list for `key` if there is one, fetching it first only in the cases the module doc names."""
        with self._lock:
            live = self._live.get(key)
            if not self._refresh:
                return live
            if live is not None and self._clock() - live.fetched_at < self._ttl:
                return live
            block = live is None and (
                self._hub_state == "online" or (self._hub_state == "unknown" and not self._has_fallback(key[0]))
            )
            job = self._schedule(key)
            if not block or job is None:
                return live
        # Each Hub request is bounded by the source's timeout, so this wait is too.
        concurrent.futures.wait([job])
        with self._lock:
            return self._live.get(key)

    def _has_fallback(self, base: str) -> bool:
        """Whether something can be shown for `base` without the Hub (lock held)."""
        if any(k[0] == base for k in self._live):
            return True
        return self._snapshot is not None and any(fits_base(e, base) for e in self._snapshot.entries)

    def _schedule(self, key: _Key) -> concurrent.futures.Future[None] | None:
        """The background fetch of `key`: the one running, a new one, or None when the Hub failed too recently.

        Call with the lock held.
        """
        running = self._pending.get(key)
        if running is not None and not running.cancelled():
            return running
        failed_at = self._failed_at if self._hub_state == "offline" else None
        if failed_at is not None and self._clock() - failed_at < self._retry_after:
            return None
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-catalog")
        # The job removes itself under the same lock, so it cannot finish before it is recorded.
        job = self._executor.submit(self._background_fetch, key)
        self._pending[key] = job
        return job

    def _background_fetch(self, key: _Key) -> None:
        try:
            self._fetch(key)
        except CatalogError as e:
            logger.warning("catalogue: background refresh of %s failed: %s", key, e)
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _fetch(self, key: _Key) -> _Listing:
        if self._hub is None:
            raise HubUnavailableError("this catalogue has no Hub source; accepted: a Catalog built with a HubSource")
        base, search, sort = key
        try:
            entries = self._hub.list_loras(base, search=search or None, sort=sort, limit=self._list_limit)
        except HubUnavailableError:
            with self._lock:
                self._hub_state, self._failed_at = "offline", self._clock()
            raise
        listing = _Listing(tuple(entries), self._clock(), datetime.now(UTC))
        with self._lock:
            self._live[key] = listing
            self._hub_state, self._failed_at = "online", None
        logger.info("catalogue: %d LoRAs from the Hub for %s", len(entries), key)
        return listing

    def _hub_side(self, key: _Key, listing: _Listing | None) -> tuple[list[LoraEntry], Freshness]:
        """The Hub part of a page (live list, else older Hub lists and the snapshot) and how fresh it is."""
        base, search, sort = key
        with self._lock:
            # With refresh off the Hub is only asked on request (refresh_now), so only a success counts as online.
            offline = self._hub_state == "offline" or (not self._refresh and self._hub_state != "online")
            older = sorted((v for k, v in self._live.items() if k[0] == base), key=lambda v: v.fetched_at)
            snapshot = self._snapshot
            now = self._clock()
        if listing is not None:
            entries = [e for e in listing.entries if fits_base(e, base)]
            if offline:
                message = f"Offline: showing the Hub list of {format_utc(listing.updated_at)}"
                return entries, Freshness("hub", listing.updated_at, True, message)
            age = describe_age(now - listing.fetched_at)
            return entries, Freshness("hub", listing.updated_at, False, f"Live from the Hub, updated {age}")
        pool = merge_by_ref(snapshot.entries if snapshot else (), *(v.entries for v in older))
        entries = sort_entries(search_entries((e for e in pool if fits_base(e, base)), search), sort)
        if older:
            updated = older[-1].updated_at
            message = (
                f"Offline: showing the Hub list of {format_utc(updated)}"
                if offline
                else f"From the Hub list of {describe_age(now - older[-1].fetched_at)}; updating"
            )
            return entries, Freshness("hub", updated, offline, message)
        if snapshot is not None:
            when = format_utc(snapshot.created_at)
            message = (
                f"Offline: showing the snapshot of {when}"
                if offline
                else f"Showing the snapshot of {when} while the Hub list loads"
            )
            return entries, Freshness("snapshot", snapshot.created_at, offline, message)
        message = "Offline: no snapshot" if offline else "Loading the list from the Hub"
        return entries, Freshness("none", None, offline, message)


def _paged(entries: list[LoraEntry], page: int, page_size: int, freshness: Freshness) -> CatalogPage:
    start = page * page_size
    return CatalogPage(
        entries=tuple(entries[start : start + page_size]),
        page=page,
        page_size=page_size,
        total_known=len(entries),
        has_more=start + page_size < len(entries),
        freshness=freshness,
    )


def _load_snapshot(path: Path | None) -> Snapshot | None:
    if path is None:
        return None
    try:
        snapshot = read_snapshot(Path(path))
    except SnapshotError as e:
        # A broken snapshot must not stop the Space: start empty and let the Hub fill the list.
        logger.warning("catalogue: starting without a snapshot: %s", e)
        return None
    logger.info("catalogue: snapshot of %s with %d entries", format_utc(snapshot.created_at), len(snapshot.entries))
    return snapshot


def _title(entry: LoraEntry) -> str:
    return entry.title.lower()
