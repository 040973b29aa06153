"""The GPU call on ZeroGPU: a generator, so that a cancel reaches the GPU worker, and errors that survive the trip.

spaces runs the call in a forked worker that can be stopped only when the call is a generator: so the run
yields after each step (`run_in_steps`) and the main process (`drive`) closes it when its request is cancelled,
which stops the run at its next step and rolls its swap back. Errors raised in the worker would come back as
bare class names, so the tree's errors travel as values (`Finished.error`); spaces' own refusals become the
tree's (`gpu_errors`): quota used up 429 with `Retry-After`, no GPU or a lost worker 503. The wrappers' facts
this rests on (`spaces/zero/wrappers.py`): docs/internals.md.
"""

from __future__ import annotations

import logging
import queue
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Generic, TypeVar

from engine.errors import (
    GenerationCancelledError,
    GenerationError,
    GpuQuotaError,
    GpuUnavailableError,
    LimitExceededError,
    SwitchboardError,
)

if TYPE_CHECKING:
    import gradio as gr

__all__ = ["Finished", "Step", "drive", "gpu_errors", "run_in_steps"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
# spaces' refusals by title (spaces/zero/client.py): a used-up quota, a duration over what the Space may ask.
_QUOTA = ("ZeroGPU quota exceeded", "ZeroGPU pending credits exceeded")
_ILLEGAL_DURATION = "ZeroGPU illegal duration"
_WORKER = "ZeroGPU worker error"
# "Try again in 0:04:12." (a timedelta as str), in spaces' quota message.
_TRY_AGAIN = re.compile(r"Try again in (?:(\d+) days?, )?(\d+):(\d{2}):(\d{2})")
_QUOTA_RETRY_S = 60


@dataclass(frozen=True)
class Step:
    """One denoising step done: the progress callback's arguments."""

    args: tuple[int, ...]


@dataclass(frozen=True)
class Finished(Generic[T]):
    """The run's end: its value, or the error of the tree it raised (pickled back as a value)."""

    value: T | None
    error: SwitchboardError | None = None


def run_in_steps(run: Callable[[Callable[..., None], threading.Event], T]) -> Iterator[Step | Finished[T]]:
    """Inside the GPU worker: `run(progress, cancel)` on a thread, a `Step` yielded for each progress call, then
    `Finished`. Closing the generator (the caller cancelled) sets `cancel` and waits for the run to stop."""
    events: queue.SimpleQueue[Step | Finished[T] | BaseException] = queue.SimpleQueue()
    cancel = threading.Event()

    def work() -> None:
        try:
            events.put(Finished(run(lambda *args: events.put(Step(args)), cancel)))
        except SwitchboardError as e:
            events.put(Finished(None, e))
        except BaseException as e:  # raised below, in the worker's own thread, as spaces expects
            events.put(e)

    thread = threading.Thread(target=work, name="gpu-run", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if isinstance(event, Finished):
                return
    finally:
        # Closed early: the run stops at its next step (GenerationCancelledError there, the swap rolled back).
        cancel.set()
        thread.join()


def drive(
    events: Iterator[Step | Finished[T]], progress: Callable[..., None] | None, cancel: threading.Event | None
) -> T:
    """In the main process: follow a GPU call's steps (reporting each to `progress`) to its value; closing it as
    soon as `cancel` is set, which stops the worker's run at its next step."""
    finished: Finished[T] | None = None
    try:
        for event in events:
            if isinstance(event, Finished):
                finished = event  # the worker's generator ends right after: let it end on its own
                continue
            if progress is not None:
                progress(*event.args)
            if cancel is not None and cancel.is_set():
                raise GenerationCancelledError("the request was cancelled while it ran on the GPU")
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    if finished is None:
        raise GpuUnavailableError("the GPU worker stopped before answering; try again shortly")
    if finished.error is not None:
        raise finished.error
    if finished.value is None:
        raise GenerationError("the GPU worker answered without a result")
    return finished.value


@contextmanager
def gpu_errors() -> Iterator[None]:
    """spaces' refusals and lost workers as errors of the tree (see the module docstring)."""
    try:
        yield
    except Exception as e:
        # A gr.Error exists only once gradio is imported (spaces imports it on ZeroGPU): looked up, not imported,
        # so the local backend, the GPU tests and the benchmarks need no UI library (bench/gpu_check.sh has none).
        gradio = sys.modules.get("gradio")
        if gradio is not None and isinstance(e, gradio.Error):
            raise _mapped(e) from e
        if isinstance(e, RuntimeError) and "closed by visitor" in str(e):
            # spaces gave up queueing for a GPU: the client had left
            raise GenerationCancelledError(f"the client went away while ZeroGPU queued the call ({e})") from e
        raise


def _mapped(error: gr.Error) -> SwitchboardError:
    title, message = getattr(error, "title", "") or "", str(getattr(error, "message", error))
    logger.warning("ZeroGPU refused or lost the call: %s: %s", title, message)
    if title in _QUOTA:
        return GpuQuotaError(f"{title}: {message}", retry_after_s=_retry_after(message))
    if title == _ILLEGAL_DURATION:
        return LimitExceededError(f"{title}: {message}; accepted: fewer steps or a smaller size")
    if title == _WORKER and message != "GPU task aborted":
        # An exception the worker raised, of which only the class name came back: unforeseen, so answered as
        # "the request failed" with an id the log carries beside it.
        return GenerationError.unforeseen(error, logger, f"the GPU worker ({message})")
    return GpuUnavailableError(f"{title or 'ZeroGPU'}: {message}; try again shortly")


def _retry_after(message: str) -> int:
    found = _TRY_AGAIN.search(message)
    if found is None:
        return _QUOTA_RETRY_S
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return max(1, int(timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()))
