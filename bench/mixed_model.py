"""What `bench.mixed` replays and measures: the arrivals, one replay of them on a device shared by an image pool
and a video pool, and the figures of a replay.

A replay sends each request at its arrival time (real time, scaled) to its pool; a pool runs one request at a
time (its own queue, FIFO), and each run takes its turn on the device through the real `DeviceScheduler`
(`engine.pipeline.stepshare`): with `step` sharing it gives the device back at every step boundary, with `run` it
holds it to its end (the whole-run lock, handed to the run with the least left when it ends: if anything kinder to
images than a plain lock). The figures: each run's latency (arrival to end), its longest wait for the device
before a step (with one image pool and one video pool, an image only ever waits there behind the video), and
the device's busy share while any run wanted it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.events import RunShare
from engine.pipeline.stepshare import DeviceScheduler, DeviceTurn

__all__ = ["Arrival", "Figures", "Recorded", "Replay", "arrivals", "figures", "p95"]


@dataclass(frozen=True)
class Arrival:
    at_s: float  # on the device's own time scale
    video: bool
    index: int


def arrivals(
    *, duration_s: float, image_s: float, image_load: float, video_every_s: float, seed: int
) -> tuple[Arrival, ...]:
    """Images at random (a Poisson stream at `image_load` of the device's image capacity, 1 / `image_s`) and a
    video every `video_every_s` (the first a third of the way into the first period), over `duration_s`."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(image_load / image_s)
    while t < duration_s:
        out.append(Arrival(t, False, 0))
        t += rng.expovariate(image_load / image_s)
    t = video_every_s / 3
    while t < duration_s:
        out.append(Arrival(t, True, 0))
        t += video_every_s
    ordered = sorted(out, key=lambda a: a.at_s)
    return tuple(Arrival(a.at_s, a.video, i) for i, a in enumerate(ordered))


class Recorded(DeviceScheduler):
    """A device scheduler that also records when each run entered and left it (for the busy share)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.intervals: list[tuple[float, float]] = []
        self.shares: list[RunShare] = []
        self.subscribe(self.shares.append)
        self._guard = threading.Lock()

    @contextmanager
    def turn(self, pool: str, pieces: int, **options: Any) -> Iterator[DeviceTurn]:
        entered = time.perf_counter()
        try:
            with super().turn(pool, pieces, **options) as turn:
                yield turn
        finally:
            with self._guard:
                self.intervals.append((entered, time.perf_counter()))


@dataclass
class Replay:
    """One replay's latencies (seconds, real time) by kind, and its scheduler's record."""

    images: list[float] = field(default_factory=list)
    videos: list[float] = field(default_factory=list)
    scheduler: Recorded = field(default_factory=Recorded)
    errors: list[BaseException] = field(default_factory=list)


def replay(plan: tuple[Arrival, ...], scale: float, run: Callable[[Arrival], None], scheduler: Recorded) -> Replay:
    """Send each arrival at `at_s × scale` seconds from now to `run` (on a thread of its own) and wait for all."""
    out = Replay(scheduler=scheduler)
    lock = threading.Lock()
    start = time.perf_counter()

    def one(arrival: Arrival) -> None:
        sent = time.perf_counter()
        try:
            run(arrival)
        except BaseException as e:
            out.errors.append(e)
            return
        with lock:
            (out.videos if arrival.video else out.images).append(time.perf_counter() - sent)

    threads = []
    for arrival in plan:
        delay = start + arrival.at_s * scale - time.perf_counter()
        if delay > 0:
            threading.Event().wait(delay)
        thread = threading.Thread(target=one, args=(arrival,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if out.errors:
        raise RuntimeError(f"{len(out.errors)} runs failed; the first: {out.errors[0]!r}") from out.errors[0]
    return out


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


@dataclass(frozen=True)
class Figures:
    image_p95_vs_alone: float
    image_wait_max_vs_video_step: float
    video_p95: float
    device_busy: float


def figures(result: Replay, image_alone_s: float, video_step_s: float) -> Figures:
    """A replay's figures: image p95 over an image alone, an image's longest wait for the device over one video
    step, the video p95 (seconds), and the device's held share of the time any run wanted it."""
    shares = result.scheduler.shares
    waits = [s.longest_wait_s for s in shares if not s.video]
    held = sum(s.device_s for s in shares)
    return Figures(
        p95(result.images) / image_alone_s,
        max(waits, default=0.0) / video_step_s,
        p95(result.videos),
        held / _union(result.scheduler.intervals),
    )


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
