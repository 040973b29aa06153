"""What the step-sharing tests share (issue 48, `engine.pipeline.stepshare`): waiting on a state, a thread that
keeps its errors, and rival runs that force a run to pause at a chosen boundary."""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.pipeline.stepshare import DeviceScheduler

WAIT_S = 30.0  # how long a test waits for a state before it fails (never reached when all is well)


class Clock:
    """The stand-in device's clock: only the run holding the device moves it, by its piece's cost."""

    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


def until(state: Callable[[], bool]) -> None:
    """Wait until `state()` holds (a state, not a time: the timeout only ends a broken test)."""
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.002)):
        if state():
            return
        done.wait(0.002)
    raise AssertionError("the state never came")


def started(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


class Rivals:
    """Sends rival runs to the device at chosen boundaries; each holds it for one piece (`hold` runs there)."""

    def __init__(self, scheduler: DeviceScheduler, hold: Callable[[], None] = lambda: None) -> None:
        self.scheduler = scheduler
        self.hold = hold
        self.threads: list[tuple[threading.Thread, list[BaseException]]] = []

    def send(self) -> None:
        """From the running run's thread: a rival queued for the device, so the run pauses at its next boundary."""

        def rival() -> None:
            with self.scheduler.turn("rival", 1):
                self.hold()

        waiting = self.scheduler.waiting
        self.threads.append(started(rival))
        until(lambda: self.scheduler.waiting == waiting + 1)

    def at_steps(self, steps: set[int]) -> Callable[[int, int], None]:
        """A progress callback that sends a rival after each of `steps` (the boundary follows the progress)."""
        return lambda step, total: self.send() if step in steps else None

    def join(self) -> None:
        for thread, errors in self.threads:
            thread.join(WAIT_S)
            assert not thread.is_alive() and not errors, errors
