"""Whether the client of the Gradio event being handled is still there, for handlers that wait without yielding.

Gradio notices a client going away when the client's event stream closes (`Queue.clean_events` marks the event
not alive), but tells a handler only by not asking it for its next item. An async generator that yields nothing
while it waits in the scheduler's queue (the named API's `/generate`, which yields previews and the result only,
as `gradio_client` keeps every yield as an output) and a coroutine (`/compare`, the UI's comparison) would never
be told, and would stay queued as ghosts: counted against `MAX_QUEUE`, downloading, then run for nobody. So they
ask, every `POLL_S`: `client_gone()` reads the event's `alive` flag, found the way spaces' ZeroGPU support finds
its event (`spaces/zero/gradio.py`, `get_event`): among the queue's active jobs, by the event id Gradio keeps in
its `LocalContext`. Outside a Gradio event (a handler called directly), or should Gradio's internals move, nobody
is ever gone, which is the behaviour before this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gradio.context import LocalContext

from engine.errors import GenerationCancelledError

__all__ = ["POLL_S", "client_gone", "until_gone"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
# How often a waiting handler asks; Gradio itself notices a closed stream within about 10 s (its read timeout).
POLL_S = 0.5


def client_gone() -> Callable[[], bool]:
    """A check for the current Gradio event: True once its client has gone (call it inside the handler)."""
    event = _current_event()
    if event is None:
        return lambda: False
    return lambda: not getattr(event, "alive", True)


async def until_gone(work: Awaitable[T], gone: Callable[[], bool]) -> T:
    """Await `work`, cancelling it once `gone()` says the client left (GenerationCancelledError is raised then)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if not task.done() and gone():
                logger.info("the client went away: its request is cancelled")
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    raise GenerationCancelledError("the client went away") from None
    finally:
        if not task.done():
            task.cancel()
    return task.result()


def _current_event() -> Any:
    blocks = LocalContext.blocks.get(None)
    event_id = LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if event_id is None or queue is None:
        return None
    for job in getattr(queue, "active_jobs", ()):
        for event in job or ():
            if getattr(event, "_id", None) == event_id:
                return event
    return None
