"""The device's time, handed out per denoising step: one `DeviceScheduler` per device (`DEVICE_SHARING`).

Every pool's run holds the device for one piece of work at a time and comes back at each boundary between two
(`DeviceTurn.boundary`, `engine.pipeline.inference.run_pieces`): an image's piece is a denoising step (its first
with its prompt's encoding; the boundary: the pipeline's step callback) or, after its last, its VAE decode; a
video's is one transformer block of a forward of its denoiser (Wan's step is two forwards, the conditional and the
unconditional guidance pass, each through its 30 blocks on the 1.3B, so an image waits at most one block: forward
pre-hooks on the blocks; a whole forward where the denoiser is compiled) or one latent frame of its VAE's decode (a
forward pre-hook on the decoder).
The policy, at each boundary where other runs wait:

- the run with the least remaining device time goes next: its remaining pieces × its pool's measured time per
  piece (a moving average of the pieces it held the device for; `first_guess_s` until one is measured), its VAE
  decode's pieces left (a video's chunks, an image's one) × its pool's time per chunk, measured apart (`left_s`,
  `PieceTimes` in `engine.pipeline.stepshare_policy`, the fleet model's too: a chunk is many times a block, and
  one average of both put a video at its decode far nearer its end than it was, so it kept the device for its
  whole decode before an image with less left);
- no run starves: one that has waited longer than `STEP_SHARING_STARVE_STEPS` of its own steps (its pieces a
  step × its piece time: a Wan step is 60 pieces, two passes of 30 blocks) goes next (the longest waiting first),
  so a video's steps keep a share of the device beside a stream of images. The bound is in steps, not pieces, so
  that splitting a step finer (a block a piece) does not make the video cut into every image run: it waits as long
  as before, and only a stream of images that holds the device that long lets it in;
- on a tie the run that holds the device keeps it (no needless pause), else the earliest arrival goes.

A paused run keeps its latents and embeddings on the device: its thread waits inside the step callback, and
resuming changes no value, so its result equals the unpaused run's byte for byte. Pools hold their own weights,
so pausing one pool's run for another pool's step swaps nothing. A pool still runs one request at a time (its
own scheduler's slot): only runs of different pools interleave. A paused run that is cancelled leaves at once
(its wait wakes on the cancel and the error unwinds the pipeline call, freeing its latents). Still one piece runs
at a time, so the memory plan keeps one working memory free, and beside it each pool's paused state
(`engine.pools.plan`; a run paused between two blocks also keeps its forward's hidden states:
`engine.pools.needs.paused_bytes`).

`mode="run"` is the whole-run lock (a run takes the device once and holds it to its end, boundaries ignored):
what ran before step sharing, and `bench.mixed`'s baseline. With `DEVICE_SHARING=off` (the default off CUDA and
on ZeroGPU, where each call has its own GPU) no scheduler is used at all.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from engine.errors import GenerationCancelledError
from engine.events import RunShare
from engine.pipeline.stepshare_policy import (
    FIRST_GUESS_S,
    PieceTimes,
    Waiter,
    averaged,
    decoding,
    goes_next,
    left_s,
    time_ahead,
)

__all__ = [
    "FIRST_GUESS_S",
    "Ahead",
    "DeviceScheduler",
    "DeviceTurn",
    "PieceTimes",
    "RunShare",
    "Waiter",
    "averaged",
    "decoding",
    "goes_next",
    "left_s",
    "time_ahead",
]

logger = logging.getLogger(__name__)

# How often a waiting run looks at its cancel event (a threading.Event cannot wake a condition by itself).
_CANCEL_POLL_S = 0.02


@dataclass(frozen=True)
class Ahead:
    """What a waiting run has before it on the device: runs of images and of videos (the one on the device
    counted), and about how long until its next piece starts."""

    images: int
    videos: int
    seconds: float

    def __str__(self) -> str:
        counts = ((self.videos, "video"), (self.images, "image"))
        runs = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for n, kind in counts if n)
        return f"waiting for the GPU: {runs or 'nothing'} ahead, about {self.seconds:.0f} s"


@dataclass(eq=False)
class _Run:
    seq: int
    pool: str
    remaining: int
    video: bool
    starve: float
    cancel: threading.Event | None
    on_wait: Callable[[Ahead], None] | None
    on_share: Callable[[RunShare], None] | None = None
    # False under the whole-run lock: its boundaries count the pieces left and never pause it.
    step: bool = True
    # Its last `chunks` pieces are its VAE decode's (timed apart: `left_s`).
    chunks: int = 0
    waiting_since: float | None = None
    held_since: float | None = None
    pauses: int = 0
    paused_s: float = 0.0
    longest_wait_s: float = 0.0
    device_s: float = 0.0
    started: bool = field(default=False)


class DeviceTurn:
    """A run's way through the device: `boundary(remaining)` at each piece's end gives the device to whichever
    run goes next (the policy: module docstring) and returns once this run holds it again."""

    def __init__(self, scheduler: DeviceScheduler, run: _Run, step: bool) -> None:
        self._scheduler = scheduler
        self._run = run
        self._step = step

    def boundary(self, remaining: int) -> None:
        """`remaining` pieces are left; with step sharing, pause here while another run goes first."""
        self._scheduler.boundary(self._run, remaining, share=self._step)

    @property
    def pauses(self) -> int:
        return self._run.pauses


class DeviceScheduler:
    """The device's pieces of work, handed out to the runs of every pool on it (policy: module docstring).
    `clock` is the scheduler's time (a stand-in device's own in tests and `bench.mixed`)."""

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter, first_guess_s: float = FIRST_GUESS_S) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._holder: _Run | None = None
        self._waiting: list[_Run] = []
        self._piece = PieceTimes(first_guess_s)
        self._seq = itertools.count(1)
        self._listeners: list[Callable[[RunShare], None]] = []

    def subscribe(self, listener: Callable[[RunShare], None]) -> None:
        """`listener` hears each run's share of the device when it ends (metrics)."""
        with self._cond:
            self._listeners.append(listener)

    @contextmanager
    def turn(
        self,
        pool: str,
        pieces: int,
        *,
        video: bool = False,
        starve: float = 8.0,
        step_pieces: int = 1,
        step: bool = True,
        chunks: int = 0,
        cancel: threading.Event | None = None,
        on_wait: Callable[[Ahead], None] | None = None,
        on_share: Callable[[RunShare], None] | None = None,
    ) -> Iterator[DeviceTurn]:
        """Hold the device for a run of `pieces` pieces of `pool` (with `step`, a piece at a time), inside the
        block, its last `chunks` a VAE decode's; `starve`: its starvation bound in its own steps of `step_pieces` pieces
        (module docstring). A cancel
        while waiting raises GenerationCancelledError. `on_wait` hears what is ahead each time the run waits
        (outside the scheduler's lock), `on_share` the run's share of the device once it leaves."""
        run = _Run(
            next(self._seq),
            pool,
            max(pieces, 1),
            video,
            starve * step_pieces,
            cancel,
            on_wait,
            on_share,
            step=step,
            chunks=chunks,
        )
        with self._cond:
            self._wait_for_device(run)
        try:
            yield DeviceTurn(self, run, step)
        finally:
            self._leave(run)

    # -- the device changes hands ------------------------------------------------------------------

    def boundary(self, run: _Run, remaining: int, *, share: bool) -> None:
        with self._cond:
            now = self._clock()
            self._held(run, now)
            run.remaining = max(remaining, 1)
            if not share or not self._waiting or self._next(now, run) is run:
                run.held_since = now
                return
            run.pauses += 1
            logger.debug("run #%d of %s paused with %d pieces left", run.seq, run.pool, run.remaining)
            self._holder = None
            self._wait_for_device(run)

    def _wait_for_device(self, run: _Run) -> None:
        """Queue `run` and return once it holds the device (caller holds the lock)."""
        now = self._clock()
        run.waiting_since = now
        self._waiting.append(run)
        if self._holder is None:
            self._hand_over(now)
        told: Ahead | None = None
        while self._holder is not run:
            if run.cancel is not None and run.cancel.is_set():
                self._waiting.remove(run)
                self._cond.notify_all()
                raise GenerationCancelledError("the request was cancelled while it waited for the device")
            if run.on_wait is not None and (ahead := self._ahead(run)) != told:
                told = ahead
                # Told outside the lock (a progress bar may take its time); the loop looks again after.
                self._cond.release()
                try:
                    run.on_wait(ahead)
                finally:
                    self._cond.acquire()
                continue
            self._cond.wait(_CANCEL_POLL_S)

    def _hand_over(self, now: float) -> None:
        """Give the free device to the waiting run that goes next (caller holds the lock)."""
        if self._holder is not None or not self._waiting:
            return
        chosen = self._next(now, None)
        self._waiting.remove(chosen)
        waited = now - (chosen.waiting_since or now)
        if chosen.started:
            chosen.paused_s += waited
        chosen.started = True
        chosen.longest_wait_s = max(chosen.longest_wait_s, waited)
        chosen.waiting_since, chosen.held_since = None, now
        self._holder = chosen
        self._cond.notify_all()

    def _next(self, now: float, holder: _Run | None) -> _Run:
        """The run that goes next among the waiting ones and `holder` (the policy: module docstring)."""
        return goes_next(self._waiting, holder, now, self._piece)

    def _held(self, run: _Run, now: float) -> None:
        """Account the piece `run` has just held the device for (caller holds the lock)."""
        if run.held_since is None:
            return
        piece = now - run.held_since
        run.held_since = None
        run.device_s += piece
        self._piece.held(run, piece)

    def _leave(self, run: _Run) -> None:
        with self._cond:
            now = self._clock()
            if self._holder is run:
                self._held(run, now)
                self._holder = None
                self._hand_over(now)
            elif run in self._waiting:
                self._waiting.remove(run)
            listeners = tuple(self._listeners)
        share = RunShare(run.pool, run.video, run.device_s, run.pauses, run.paused_s, run.longest_wait_s)
        for listener in (*listeners, *([run.on_share] if run.on_share is not None else [])):
            listener(share)

    # -- estimates ---------------------------------------------------------------------------------

    def _left_s(self, run: _Run) -> float:
        return left_s(run, self._piece)

    def _ahead(self, run: _Run) -> Ahead:
        """What goes before `run` (caller holds the lock): the holder, and the waiting runs with less left."""
        mine = self._left_s(run)
        before = [r for r in self._waiting if r is not run and self._left_s(r) < mine]
        holder = self._holder
        seconds = sum(self._left_s(r) for r in before)
        if holder is not None:
            before.append(holder)
            # The holder runs to its end before `run` when it has less left or holds the whole-run lock; else one
            # piece of it.
            whole = self._left_s(holder) <= mine or not holder.step
            seconds += self._left_s(holder) if whole else self._piece(holder.pool)
        videos = sum(r.video for r in before)
        return Ahead(images=len(before) - videos, videos=videos, seconds=seconds)

    def ahead_s(self, pool: str, own_s: float) -> float:
        """The device time other pools' runs take before a new run of `pool` needing `own_s` ends (`time_ahead`).
        Queue places and Retry-After count it."""
        with self._cond:
            runs = [*self._waiting, *([self._holder] if self._holder is not None else [])]
            return time_ahead(runs, pool, own_s, self._piece, whole_run=not all(r.step for r in runs))

    def piece_s(self, pool: str) -> float | None:
        """`pool`'s measured time per piece (None: not yet measured)."""
        with self._cond:
            return self._piece.measured(pool)

    @property
    def waiting(self) -> int:
        """Runs waiting for the device (paused or not yet started)."""
        with self._cond:
            return len(self._waiting)

    @property
    def busy(self) -> bool:
        """Whether a run holds the device now."""
        with self._cond:
            return self._holder is not None
