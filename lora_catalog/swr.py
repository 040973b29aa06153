"""A count-bounded cache whose entries are served stale while one background lookup revalidates them (RFC 5861).

Hub metadata (`HubSource`) and Civitai answers are cached through it: a fresh entry
is answered from memory; past its TTL it is still answered at once while one background lookup refreshes it;
when that lookup cannot reach the source (`unavailable`), the entry keeps being served, with `stale` saying
how old it is and why, and the lookup is retried at most every `retry_s`; when the source answers that the
thing is gone or refused (any other CatalogError), the entry is dropped. Thread-safe.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from cachetools import LRUCache

from .errors import CatalogError, HubUnavailableError

__all__ = ["StaleWhileRevalidate", "Staleness"]

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class _Cached(Generic[V]):
    value: V
    fetched_at: float
    failure: str | None = None
    retry_at: float = 0.0


@dataclass(frozen=True)
class Staleness:
    """How old a stale entry is, and why it was not refreshed (None: a refresh is under way)."""

    age_s: float
    failure: str | None


class StaleWhileRevalidate(Generic[K, V]):
    """`get(key)` through `lookup`, cached for `ttl_s` and then served stale while revalidated."""

    def __init__(
        self,
        lookup: Callable[[K], V],
        *,
        ttl_s: float,
        name: str,
        maxsize: int = 1024,
        retry_s: float = 60.0,
        unavailable: type[CatalogError] = HubUnavailableError,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._name = name
        self._retry_s = min(retry_s, ttl_s)
        self._unavailable = unavailable
        self._clock = clock
        self._lock = threading.Lock()
        # Count-bounded: past its TTL an entry stays (served stale while revalidated), so no TTLCache.
        self._entries: LRUCache[K, _Cached[V]] = LRUCache(maxsize=maxsize)
        self._revalidating: set[K] = set()
        self._executor: ThreadPoolExecutor | None = None

    def get(self, key: K) -> V:
        """The value for `key`: cached (stale or not), else looked up now (errors pass through, nothing cached)."""
        with self._lock:
            hit = self._entries.get(key)
            now = self._clock()
            if hit is not None:
                if now - hit.fetched_at >= self._ttl_s and now >= hit.retry_at and key not in self._revalidating:
                    self._revalidating.add(key)
                    if self._executor is None:
                        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self._name}-swr")
                    self._executor.submit(self._revalidate, key)
                return hit.value
        return self._fetch(key)

    def peek(self, key: K) -> V | None:
        """The cached value for `key` (stale or not), or None; never looks it up or revalidates it."""
        with self._lock:
            hit = self._entries.get(key)
        return hit.value if hit is not None else None

    def stale(self, key: K) -> Staleness | None:
        """None when `key`'s entry is fresh (or absent); else its age and why it was not refreshed."""
        with self._lock:
            hit = self._entries.get(key)
            now = self._clock()
        if hit is None or now - hit.fetched_at < self._ttl_s:
            return None
        return Staleness(now - hit.fetched_at, hit.failure)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the background revalidations under way (tests); False if some still run after `timeout`."""
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            with self._lock:
                busy = bool(self._revalidating)
            if not busy:
                return True
            if deadline is not None and self._clock() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        """Stop background revalidation (a lookup in progress finishes on its own)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _fetch(self, key: K) -> V:
        fetched_at = self._clock()
        value = self._lookup(key)
        with self._lock:
            self._entries[key] = _Cached(value, fetched_at)
        return value

    def _revalidate(self, key: K) -> None:
        started = self._clock()
        try:
            self._fetch(key)
        except CatalogError as e:
            with self._lock:
                hit = self._entries.get(key)
                if isinstance(e, self._unavailable) and hit is not None:
                    # Keep serving it; ask again after a while, not on every request while the source is down.
                    self._entries[key] = dataclasses.replace(hit, failure=str(e), retry_at=started + self._retry_s)
                else:
                    # The source answered that it is gone, or refused now: stop serving it.
                    self._entries.pop(key, None)
            logger.warning("%s: could not revalidate %s: %s", self._name, key, e)
        else:
            logger.info("%s: revalidated %s in %.2f s", self._name, key, self._clock() - started)
        finally:
            with self._lock:
                self._revalidating.discard(key)
