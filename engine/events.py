"""What the engine reports as it works: an observer interface, and the fan-out the engine calls.

The engine knows nothing of how its events are counted (`serving.http.metrics` turns them into Prometheus
metrics); it only calls `EngineEvents`, which passes each event to whoever subscribed. Durations are in
seconds. Levels (queue length, bytes per tier, the active set) are not events: an observer reads them
from `Engine.status()` when it needs them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["EngineEvents", "EngineObserver", "RunShare", "Tier"]

logger = logging.getLogger(__name__)

Tier = Literal["host", "device"]


@dataclass(frozen=True)
class RunShare:
    """One finished run's share of the device (`engine.pipeline.stepshare`): its pool, whether a video, the device
    time it held, how often and how long it was paused for other runs, and its longest wait for one step."""

    pool: str
    video: bool
    device_s: float
    pauses: int
    paused_s: float
    longest_wait_s: float


class EngineObserver(Protocol):
    """Callbacks for what the engine did; each is called on the thread that did it, and must be quick."""

    def request_done(self, transport: str, status: int) -> None:
        """A request through `transport` ended with HTTP-style `status` (200, or its error's status)."""

    def queue_waited(self, seconds: float) -> None:
        """A request waited this long for the pipeline."""

    def prepared(self, seconds: float) -> None:
        """A request's adapters were made ready (resolved, and on a miss downloaded and converted)."""

    def swapped(self, seconds: float) -> None:
        """The fused adapter set changed (one swap)."""

    def inferred(self, seconds: float) -> None:
        """The pipeline ran one generation."""

    def cache_lookup(self, tier: Tier, hit: bool) -> None:
        """An adapter was looked up in a cache tier."""

    def evicted(self, tier: Tier, nbytes: int) -> None:
        """An adapter left a cache tier to make room."""

    def hub_error(self, error_type: str) -> None:
        """Talking to the Hub failed (unreachable, 5xx, unreadable answer); `error_type` names the error class."""

    def device_shared(self, share: RunShare) -> None:
        """A run left the device (run or step sharing): its share of it."""


class EngineEvents:
    """The engine's one outlet for events: passes each to every subscribed observer.

    An observer that raises is logged and skipped: counting must never fail a request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observers: tuple[EngineObserver, ...] = ()

    def subscribe(self, observer: EngineObserver) -> None:
        with self._lock:
            self._observers = (*self._observers, observer)

    def _each(self) -> tuple[EngineObserver, ...]:
        with self._lock:
            return self._observers

    def request_done(self, transport: str, status: int) -> None:
        for observer in self._each():
            with _guard("request_done"):
                observer.request_done(transport, status)

    def queue_waited(self, seconds: float) -> None:
        for observer in self._each():
            with _guard("queue_waited"):
                observer.queue_waited(seconds)

    def prepared(self, seconds: float) -> None:
        for observer in self._each():
            with _guard("prepared"):
                observer.prepared(seconds)

    def swapped(self, seconds: float) -> None:
        for observer in self._each():
            with _guard("swapped"):
                observer.swapped(seconds)

    def inferred(self, seconds: float) -> None:
        for observer in self._each():
            with _guard("inferred"):
                observer.inferred(seconds)

    def cache_lookup(self, tier: Tier, hit: bool) -> None:
        for observer in self._each():
            with _guard("cache_lookup"):
                observer.cache_lookup(tier, hit)

    def evicted(self, tier: Tier, nbytes: int) -> None:
        for observer in self._each():
            with _guard("evicted"):
                observer.evicted(tier, nbytes)

    def hub_error(self, error_type: str) -> None:
        for observer in self._each():
            with _guard("hub_error"):
                observer.hub_error(error_type)

    def device_shared(self, share: RunShare) -> None:
        for observer in self._each():
            with _guard("device_shared"):
                observer.device_shared(share)


@contextmanager
def _guard(event: str) -> Iterator[None]:
    """Log an observer's failure instead of raising it into the request that reported the event."""
    try:
        yield
    except Exception:
        logger.exception("an observer of the %s event failed; the request goes on", event)
