"""A blocking generation as a stream: preview frames while it runs, then its result.

The engine calls its preview callback from inside the denoising loop; a Gradio generator has to yield
from its own thread. `stream` runs the work in a worker thread (in a copy of the caller's context, so
Gradio's progress bar still finds its event) and hands the frames over a queue. A consumer slower than
the previews gets the newest frame only: a stale preview is not worth encoding. Closing the stream (the
browser went away) cancels the work through its `cancel` event.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from PIL.Image import Image

__all__ = ["Frame", "Preview", "stream"]

T = TypeVar("T")
Preview = Callable[[int, Image], None]


@dataclass(frozen=True)
class Frame:
    """The image so far, after `step` denoising steps."""

    step: int
    image: Image


@dataclass(frozen=True)
class _Done(Generic[T]):
    result: T | None = None
    error: BaseException | None = None


def stream(work: Callable[[Preview, threading.Event], T]) -> Iterator[Frame | T]:
    """Yield `Frame`s as `work(preview, cancel)` reports them, then what it returned (or raise what it raised)."""
    items: queue.SimpleQueue[Frame | _Done[T]] = queue.SimpleQueue()
    cancel = threading.Event()

    def preview(step: int, image: Image) -> None:
        items.put(Frame(step, image))

    def target() -> None:
        try:
            items.put(_Done(result=work(preview, cancel)))
        except BaseException as e:  # handed to the consumer, which raises it in its own thread
            items.put(_Done(error=e))

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(target,), name="generate-stream", daemon=True)
    worker.start()
    try:
        while True:
            item = items.get()
            while isinstance(item, Frame) and not items.empty():
                item = items.get()
            if isinstance(item, _Done):
                break
            yield item
    finally:
        cancel.set()
        worker.join()
    if item.error is not None:
        raise item.error
    yield item.result  # type: ignore[misc]
