"""Running a blocking call from a Gradio generator handler, so a browser that goes away cancels it.

Gradio cannot stop a plain function running in its thread pool when the client disconnects: it only
marks the event dead. A generator handler is different: after each yield Gradio checks that the event
is alive, and when it is not it stops iterating and closes the generator. `until_closed` runs the call in
its own thread and yields a no-op update every `poll_s`; closing the generator sets the call's cancel
event, and the engine stops at the next denoising step (before the VAE decode).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["until_closed"]

T = TypeVar("T")
U = TypeVar("U")


def until_closed(call: Callable[[threading.Event], T], tick: U, *, poll_s: float = 0.25) -> Generator[U, None, T]:
    """Yield `tick` while `call(cancel)` runs; return its result (or raise its error).

    Use as `result = yield from until_closed(...)` in a generator handler.
    """
    cancel = threading.Event()
    future: Future[T] = Future()
    # Gradio's progress and request context live in context variables: the call needs them in its thread.
    context = contextvars.copy_context()

    def work() -> None:
        try:
            future.set_result(context.run(call, cancel))
        except BaseException as e:  # handed to the generator, which re-raises it in Gradio's thread
            future.set_exception(e)

    threading.Thread(target=work, name="ui-generate", daemon=True).start()
    try:
        while True:
            try:
                return future.result(timeout=poll_s)
            except TimeoutError:
                yield tick
    finally:
        if not future.done():
            # Closed before the result came: the client went away (or the event was cancelled).
            cancel.set()
