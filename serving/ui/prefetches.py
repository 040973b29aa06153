"""A browser session's prefetches: one per LoRA slot, dropped when the user picks another LoRA for that slot or
leaves the page.

A gallery click prepares its LoRA ahead of Generate (`Handlers.prefetch`, which waits in the pool's prefetch lane,
`engine.pools.prefetch`). The click before it in the same slot is then no longer wanted: its task is cancelled,
which takes it out of the lane if it has not started. Leaving the page (Gradio's `unload`) drops all of the
session's. Kept by session and slot, on the event loop the handlers run on (no lock: one loop touches it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["SessionPrefetches"]

logger = logging.getLogger(__name__)


class SessionPrefetches:
    """The prefetch under way for each (session, slot)."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, str], asyncio.Task[Any]] = {}

    async def run(self, session: str, slot: str, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` as this session's prefetch for `slot`, dropping the one it replaces; False when `work` was
        dropped in turn (a newer pick, or the session left) rather than finished. Its errors are raised."""
        key = (session, slot)
        previous = self._running.get(key)
        if previous is not None:
            previous.cancel()
        task = asyncio.ensure_future(work)
        self._running[key] = task
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                return False  # dropped by `run` or `leave`, not by this handler being cancelled
            raise
        finally:
            if self._running.get(key) is task:
                del self._running[key]
        return True

    def leave(self, session: str) -> int:
        """Drop every prefetch of a session that has gone; returns how many were under way."""
        gone = [key for key in self._running if key[0] == session]
        for key in gone:
            self._running.pop(key).cancel()
        if gone:
            logger.info("session left: %d prefetches dropped", len(gone))
        return len(gone)

    @property
    def running(self) -> int:
        return len(self._running)
