"""Prefetches (a gallery click preparing its LoRA ahead of Generate): a lane of their own, behind every request.

Never in a request's way: one at a time on this lane's own thread, through the preparer's prefetch gate, never
the scheduler's threads or the requests' load gate (a request needing the very LoRA being fetched shares its
download). Bounded: past `pending` waiting, the oldest is dropped (the newest click is the one wanted). Dropped
when no longer wanted: a cancelled waiter takes its prefetch out before it starts; one already loading
finishes into the cache. Written here because an executor's queue is unbounded and cannot drop its oldest; the
thread runs only while there is work. The reasoning: docs/internals.md.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable

from engine.errors import EngineBusyError
from engine.requests import GenerateRequest

__all__ = ["PrefetchLane"]

logger = logging.getLogger(__name__)

Open = Callable[[GenerateRequest], tuple[object, Callable[[], None]]]


class PrefetchLane:
    """One pool's prefetches (see the module docstring); `prepare` is the pool's preparation for this lane."""

    def __init__(self, prepare: Open, *, pending: int) -> None:
        if pending < 1:
            raise ValueError(f"pending={pending} must be at least 1")
        self._prepare = prepare
        self._pending = pending
        self._lock = threading.Lock()
        self._waiting: deque[tuple[GenerateRequest, concurrent.futures.Future[None]]] = deque()
        self._worker: threading.Thread | None = None
        self._closed = False

    def submit(self, request: GenerateRequest) -> concurrent.futures.Future[None]:
        """Prepare `request`'s LoRAs into the cache, after every queued request's; the future ends when done
        (cancel it to drop the prefetch while it waits)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                dropped = [future]
            else:
                self._waiting.append((request, future))
                dropped = [self._waiting.popleft()[1] for _ in range(len(self._waiting) - self._pending)]
                if self._worker is None:
                    self._worker = threading.Thread(target=self._run, name="prefetch", daemon=True)
                    self._worker.start()
        for stale in dropped:
            _refuse(stale, f"{self._pending} newer LoRAs are waiting to be prepared ahead")
        return future

    @property
    def waiting(self) -> int:
        """Prefetches waiting (the one loading not counted)."""
        with self._lock:
            return len(self._waiting)

    def close(self) -> None:
        """Drop every waiting prefetch; the one loading finishes."""
        with self._lock:
            self._closed = True
            dropped = [future for _, future in self._waiting]
            self._waiting.clear()
        for stale in dropped:
            _refuse(stale, "the engine is shutting down")

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    self._worker = None
                    return
                request, future = self._waiting.popleft()
            if not future.set_running_or_notify_cancel():
                logger.info("prefetch of %s dropped before it started", _refs(request))
                continue
            try:
                _, release = self._prepare(request)
            except BaseException as e:  # handed to the waiter: nothing is swallowed
                future.set_exception(e)
                continue
            release()
            future.set_result(None)


def _refuse(future: concurrent.futures.Future[None], why: str) -> None:
    if future.set_running_or_notify_cancel():
        future.set_exception(
            EngineBusyError(f"preparing this LoRA ahead was dropped: {why}; it is prepared when you generate")
        )


def _refs(request: GenerateRequest) -> str:
    return ", ".join(str(getattr(spec, "ref", spec)) for spec in request.loras) or "no LoRA"
