"""What a pool's replica tells our router (`serving.cluster.policy`), both sides of Serve's routing stats.

A replica's `SetBook` keeps the adapter sets it holds prepared, is loading and has on disk (with their costs),
the set fused now, and running means of the measured costs; Serve hands its dict to the routers every
`CLUSTER_STATS_PERIOD_S`. `read_stats` reads it back strictly (pydantic): a report that does not fit counts as
no report. No ray here: tested without a cluster. Details: docs/internals.md, "serving/cluster/stats.py".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping

from cachetools import LRUCache
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.requests import GenerateResult

__all__ = ["Measured", "ReplicaStats", "SetBook", "SetCost", "read_stats"]

logger = logging.getLogger(__name__)

# Sets reported as on disk: bounded, so a report stays a few tens of KB however long the replica lives.
DISK_REPORTED = 1024
# Weight of the newest sample in the running means: about the last ten requests.
_NEWEST = 0.2
_FROZEN = ConfigDict(frozen=True, extra="ignore")


class SetCost(BaseModel):
    """What one adapter set cost a replica the first time: its download (resolve included) and preparation."""

    model_config = _FROZEN

    download_s: float = Field(ge=0.0)
    prepare_s: float = Field(ge=0.0)


class Measured(BaseModel):
    """Running means of a replica's measured costs, seconds; None until a request measured it."""

    model_config = _FROZEN

    inference_s: float | None = Field(default=None, ge=0.0)
    swap_s: float | None = Field(default=None, ge=0.0)
    prepare_s: float | None = Field(default=None, ge=0.0)
    download_s: float | None = Field(default=None, ge=0.0)


class ReplicaStats(BaseModel):
    """One replica's report (`SetBook.report`), as the router reads it."""

    model_config = _FROZEN

    at: float  # the replica's clock (time.time()) when it answered: how fresh this is
    prepared: frozenset[str] = frozenset()
    loading: frozenset[str] = frozenset()
    fused: str | None = None
    disk: dict[str, SetCost] = Field(default_factory=dict)
    measured: Measured = Field(default_factory=Measured)


def read_stats(report: Mapping[str, object] | None) -> ReplicaStats | None:
    """A replica's routing stats as the router uses them; None when it has none yet or they do not fit."""
    if not report:
        return None
    try:
        return ReplicaStats.model_validate(report)
    except ValidationError as e:
        logger.warning("a replica's routing stats do not fit (%s); routing as if it had not answered", e)
        return None


class SetBook:
    """The replica's side: what it holds, loads and measured, reported by `report` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prepared: set[str] = set()
        self._loading: Counter[str] = Counter()
        self._fused: str | None = None
        self._disk: LRUCache[str, SetCost] = LRUCache(maxsize=DISK_REPORTED)
        self._means: dict[str, float] = {}

    def started(self, set_id: str) -> None:
        """A request for `set_id` arrived; unless the set is held it is loading until `finished`."""
        with self._lock:
            if set_id and set_id not in self._prepared:
                self._loading[set_id] += 1

    def finished(self, set_id: str, result: GenerateResult | None) -> None:
        """The request ended: with its result (what it cost is measured), or None when it failed."""
        with self._lock:
            if self._loading[set_id] > 0:
                self._loading[set_id] -= 1
            if not self._loading[set_id]:
                del self._loading[set_id]
            if result is None:
                return
            timings = result.timings
            self._fused = set_id
            self._mean("inference_s", timings.inference)
            if result.swapped:
                self._mean("swap_s", timings.apply)
            on_disk = self._disk.get(set_id)  # a read marks the set recently used in the LRU
            if any(use.cache == "miss" for use in result.adapters):
                self._mean("prepare_s", timings.prepare)
                if on_disk is None:
                    # The first miss here downloaded the files (resolve included): later misses find them on disk.
                    self._mean("download_s", timings.resolve)
                    self._disk[set_id] = SetCost(download_s=timings.resolve, prepare_s=timings.prepare)

    def held(self, set_id: str) -> None:
        """Serve's LRU holds the set with its adapters prepared (`AdapterPin.hold`)."""
        with self._lock:
            self._prepared.add(set_id)

    def evicted(self, set_id: str) -> None:
        """Serve evicted the set (`AdapterPin.__del__`): its adapters leave the engine's cache."""
        with self._lock:
            self._prepared.discard(set_id)

    def report(self, now: float | None = None) -> dict[str, object]:
        """The routing stats: JSON-ready, read back by `read_stats`."""
        with self._lock:
            return {
                "at": time.time() if now is None else now,
                "prepared": sorted(self._prepared),
                "loading": sorted(self._loading),
                "fused": self._fused,
                "disk": {set_id: cost.model_dump() for set_id, cost in self._disk.items()},
                "measured": dict(self._means),
            }

    def _mean(self, name: str, sample: float) -> None:
        old = self._means.get(name)
        self._means[name] = sample if old is None else (1 - _NEWEST) * old + _NEWEST * sample
