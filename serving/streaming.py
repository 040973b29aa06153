"""A generation as a stream: preview frames while it runs, ticks while it waits, then its result.

The engine calls its preview callback from the thread that denoises; a Gradio handler yields on the event
loop. `stream` runs the (async) generation as a task and hands frames over with `call_soon_threadsafe`.
A consumer slower than the previews gets the newest frame only: a stale preview is not worth encoding.
While nothing new comes it yields `None` every `poll_s` (a tick): Gradio checks the client after each
yield, so a browser that went away closes the stream, and closing it cancels the generation's task: it
leaves the queue, or stops at its next step (before the VAE decode).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from PIL.Image import Image

__all__ = ["Frame", "Preview", "stream"]

T = TypeVar("T")
Preview = Callable[[int, Image], None]


@dataclass(frozen=True)
class Frame:
    """The image so far, after `step` denoising steps."""

    step: int
    image: Image


async def stream(
    work: Callable[[Preview], Awaitable[T]], *, poll_s: float = 0.25
) -> AsyncGenerator[Frame | T | None, None]:
    """Yield `Frame`s as `work(preview)` reports them and `None` ticks while it runs, then what it returned
    (or raise what it raised); closing the stream before the end cancels the work."""
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[Frame] = asyncio.Queue()

    def preview(step: int, image: Image) -> None:
        loop.call_soon_threadsafe(frames.put_nowait, Frame(step, image))

    task = asyncio.ensure_future(work(preview))
    getter: asyncio.Future[Frame] | None = None
    try:
        while not task.done():
            getter = asyncio.ensure_future(frames.get())
            done, _ = await asyncio.wait({task, getter}, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                frame = getter.result()
                while not frames.empty():
                    frame = frames.get_nowait()
                yield frame
                continue
            getter.cancel()
            if not task.done():
                yield None
    finally:
        if getter is not None:
            getter.cancel()  # cancelled while waiting: no frame reader is left pending
        if not task.done():
            # Closed early: the client went away. The task leaves the queue, or its run stops at its next step.
            task.cancel()
    yield task.result()
