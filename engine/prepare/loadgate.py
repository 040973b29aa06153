"""The bound on adapter preparations in flight: at most N loads at once, and at most B bytes of them.

A cold adapter costs about its file size in host RAM while it is downloaded, parsed and converted, so the
bound is on both the number of loads (`PREPARE_WORKERS`) and their bytes (`PREPARE_INFLIGHT_BYTES`).
A single file larger than the whole byte budget may still load, alone: refusing it here would refuse
what `MAX_ADAPTER_BYTES` accepts, and waiting for room that can never come would hang it.

Written here rather than taken from a library: a semaphore counts units, not bytes, and the two bounds must
be taken together, under one lock, or two loads could each hold half of what the other needs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LoadGate"]

logger = logging.getLogger(__name__)


class LoadGate:
    """Admits loads in arrival order while both the count and the byte bound hold."""

    def __init__(self, *, workers: int, budget: int) -> None:
        if workers < 1 or budget < 1:
            raise ValueError(f"workers={workers} and budget={budget} must both be at least 1")
        self.workers = workers
        self.budget = budget
        self._cond = threading.Condition()
        self._loads = 0
        self._bytes = 0
        self._peak_bytes = 0
        self._peak_loads = 0
        # Tickets in arrival order: a large load is not starved by a stream of small ones.
        self._next = 0
        self._serving = 0

    @contextmanager
    def hold(self, nbytes: int, what: str) -> Iterator[None]:
        """Block until this load may start; its bytes count against the budget until the block ends."""
        nbytes = max(0, nbytes)
        started = time.perf_counter()
        with self._cond:
            ticket = self._next
            self._next += 1
            while not (ticket == self._serving and self._fits(nbytes)):
                self._cond.wait()
            self._serving += 1
            self._loads += 1
            self._bytes += nbytes
            self._peak_bytes = max(self._peak_bytes, self._bytes)
            self._peak_loads = max(self._peak_loads, self._loads)
            loads, in_flight = self._loads, self._bytes
            # The next in line may fit too.
            self._cond.notify_all()
        waited = time.perf_counter() - started
        logger.debug(
            "load of %s (%d bytes) started after %.3f s: %d loads, %d bytes in flight",
            what,
            nbytes,
            waited,
            loads,
            in_flight,
        )
        try:
            yield
        finally:
            with self._cond:
                self._loads -= 1
                self._bytes -= nbytes
                self._cond.notify_all()

    def _fits(self, nbytes: int) -> bool:
        if self._loads >= self.workers:
            return False
        return self._loads == 0 or self._bytes + nbytes <= self.budget

    @property
    def in_flight(self) -> tuple[int, int]:
        """(loads, bytes) in flight now."""
        with self._cond:
            return self._loads, self._bytes

    @property
    def peaks(self) -> tuple[int, int]:
        """The most (loads, bytes) ever in flight at once."""
        with self._cond:
            return self._peak_loads, self._peak_bytes
