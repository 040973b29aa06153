"""The device shared step by step (issue 48, `engine.pipeline.stepshare`), on a stand-in device: each piece holds
the device for a time from a table, counted on a clock only the holder advances, so every wait is deterministic.
An image arriving during a video starts after at most one video step, and is told what it waits behind; a run
overtaken longer than its bound goes next; a paused run that is cancelled leaves at once; each run's share of the
device is reported."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from engine.errors import GenerationCancelledError
from engine.events import RunShare
from engine.pipeline.sharing import device_turn, scheduler_for
from engine.pipeline.stepshare import FIRST_GUESS_S, Ahead, DeviceScheduler
from tests.support.stepshare import WAIT_S, Clock, started, until

VIDEO_STEP, IMAGE_STEP = 10.0, 0.5


@dataclass
class StandIn:
    """A stand-in device: its clock, its scheduler, each piece's start (pool, clock), each run's share, and the runs
    that arrived on threads of their own while another held it."""

    clock: Clock
    scheduler: DeviceScheduler
    log: list[tuple[str, float]] = field(default_factory=list)
    shares: list[RunShare] = field(default_factory=list)
    arrived: list[tuple[threading.Thread, list[BaseException]]] = field(default_factory=list)

    def run(
        self,
        pool: str,
        steps: int,
        cost: float,
        *,
        video: bool = False,
        starve: float = 8.0,
        step_pieces: int = 1,
        cancel: threading.Event | None = None,
        mid_step: Callable[[int], None] = lambda step: None,
        on_wait: Callable[[Ahead], None] | None = None,
    ) -> None:
        """A run of `steps` pieces of `cost` each, each piece's start logged (pool, clock)."""
        turn_of = self.scheduler.turn(
            pool, steps, video=video, starve=starve, step_pieces=step_pieces, cancel=cancel, on_wait=on_wait
        )
        with turn_of as turn:
            for step in range(steps):
                self.log.append((pool, self.clock()))
                self.clock.advance(cost / 2)
                mid_step(step)
                self.clock.advance(cost / 2)
                turn.boundary(steps - step - 1)

    def arrive(self, target: Callable[[], None]) -> None:
        """`target` on a thread of its own; returns once it waits for the device."""
        waiting = self.scheduler.waiting
        self.arrived.append(started(target))
        until(lambda: self.scheduler.waiting == waiting + 1)

    def join(self) -> None:
        """Every arrived run has ended, without an error."""
        for thread, errors in self.arrived:
            thread.join(WAIT_S)
            assert not errors

    @property
    def order(self) -> list[str]:
        return [pool for pool, _ in self.log]


def stand_in(first_guess_s: float = FIRST_GUESS_S) -> StandIn:
    """A fresh stand-in device whose scheduler guesses `first_guess_s` for a piece until one is measured."""
    clock = Clock()
    device = StandIn(clock, DeviceScheduler(clock=clock, first_guess_s=first_guess_s))
    device.scheduler.subscribe(device.shares.append)
    return device


def test_an_image_arriving_during_a_video_starts_after_at_most_one_video_step():
    device = stand_in(first_guess_s=IMAGE_STEP)
    told: list[str] = []
    arrived: list[float] = []

    def image() -> None:
        arrived.append(device.clock())
        device.run("sdxl", 4, IMAGE_STEP, on_wait=lambda ahead: told.append(str(ahead)))

    def mid_step(step: int) -> None:
        if step == 2:  # the image arrives halfway through the video's third step
            device.arrive(image)

    device.run("wan", 6, VIDEO_STEP, video=True, mid_step=mid_step)
    device.join()
    first_image = next(t for pool, t in device.log if pool == "sdxl")
    assert first_image - arrived[0] <= VIDEO_STEP
    # The image's four steps ran between the video's third and fourth: one pause of the video.
    assert device.order == ["wan"] * 3 + ["sdxl"] * 4 + ["wan"] * 3
    assert told == ["waiting for the GPU: 1 video ahead, about 10 s"]
    image_share, video_share = device.shares
    assert (video_share.pool, video_share.pauses, video_share.paused_s) == ("wan", 1, 4 * IMAGE_STEP)
    assert video_share.device_s == 6 * VIDEO_STEP and image_share.device_s == 4 * IMAGE_STEP
    assert image_share.longest_wait_s == VIDEO_STEP / 2 and image_share.pauses == 0


def test_a_run_overtaken_longer_than_its_bound_goes_next():
    device = stand_in(first_guess_s=1.0)
    # A video of 1 s steps, its bound 3 of them, behind an image run with far less left (20 × 0.25 s).

    def mid_step(step: int) -> None:
        if step == 0:
            device.arrive(lambda: device.run("sdxl", 20, 0.25))

    device.run("wan", 40, 1.0, video=True, starve=3.0, mid_step=mid_step)
    device.join()
    order = device.order
    # Without the bound the image would run its 20 steps at once; the video waits at most 3 s and one image step.
    first = order.index("sdxl")
    assert order[first : first + 13] == ["sdxl"] * 13 and order[first + 13] == "wan"
    starts = [t for pool, t in device.log if pool == "wan"]
    assert max(b - a for a, b in itertools.pairwise(starts)) <= 1.0 + 3.0 + 0.25


def test_the_bound_counts_a_run_s_own_steps_however_finely_they_are_split():
    device = stand_in(first_guess_s=0.5)
    # A video of 1 s steps in two pieces of 0.5 s (a Wan step's guidance passes, or its blocks), its bound 3 steps:
    # 3 s, not 3 pieces' 1.5 s, behind an image run with far less left (20 × 0.25 s).

    def mid_step(step: int) -> None:
        if step == 0:
            device.arrive(lambda: device.run("sdxl", 20, 0.25))

    device.run("wan", 40, 0.5, video=True, starve=3.0, step_pieces=2, mid_step=mid_step)
    device.join()
    order = device.order
    first = order.index("sdxl")
    assert order[first : first + 13] == ["sdxl"] * 13 and order[first + 13] == "wan"


def test_a_paused_run_that_is_cancelled_leaves_at_once():
    device = stand_in(first_guess_s=IMAGE_STEP)
    scheduler = device.scheduler
    cancel = threading.Event()
    holding = threading.Event()
    release = threading.Event()

    def image() -> None:
        with scheduler.turn("sdxl", 1):
            holding.set()
            release.wait(WAIT_S)

    def mid_step(step: int) -> None:
        if step == 1:
            device.arrive(image)

    video, video_errors = started(
        lambda: device.run("wan", 5, VIDEO_STEP, video=True, cancel=cancel, mid_step=mid_step)
    )
    until(holding.is_set)
    assert scheduler.waiting == 1  # the video, paused
    cancel.set()
    video.join(WAIT_S)
    # It left while the image still holds the device: nothing waits, and it raised the cancel.
    assert not video.is_alive() and scheduler.waiting == 0 and scheduler.busy
    assert [type(e) for e in video_errors] == [GenerationCancelledError]
    release.set()
    device.join()
    assert not scheduler.busy
    assert device.order == ["wan", "wan"]


def test_a_run_alone_never_pauses():
    device = stand_in()
    device.run("wan", 5, VIDEO_STEP, video=True)
    assert device.shares == [RunShare("wan", True, 5 * VIDEO_STEP, 0, 0.0, 0.0)]
    assert device.scheduler.piece_s("wan") == pytest.approx(VIDEO_STEP)


def test_the_whole_run_lock_counts_a_run_s_pieces_left_and_never_pauses_it():
    """`DEVICE_SHARING=run` (ZeroGPU's): the run keeps the device to its end, yet its boundaries count what it has
    left, so a waiting request is told the rest of the run ahead of it (before, a run's pieces were never counted
    and the whole run was timed as one piece)."""
    device = stand_in(first_guess_s=IMAGE_STEP)
    clock, scheduler = device.clock, device.scheduler
    cpu = torch.device("cpu")

    def image() -> None:
        with scheduler.turn("sdxl", 2, step=False) as turn:
            device.log.append(("sdxl", clock()))
            turn.boundary(1)

    turn = device_turn("run", cpu, "wan", 6, video=True, starve=8.0, cancel=None, on_wait=None)
    with scheduler_for(cpu, scheduler), turn as boundary:
        assert boundary is not None
        for step in range(6):
            device.log.append(("wan", clock()))
            clock.advance(VIDEO_STEP)
            if step == 1:
                device.arrive(image)
            boundary(6 - step - 1)
            if step == 1:
                # Four pieces of the video are left, each timed: all of them are ahead of the image.
                assert scheduler.ahead_s("sdxl", 2 * IMAGE_STEP) == pytest.approx(4 * VIDEO_STEP)
    device.join()
    assert device.order == ["wan"] * 6 + ["sdxl"]
    assert scheduler.piece_s("wan") == pytest.approx(VIDEO_STEP)


def test_a_video_at_its_decode_counts_its_chunks_time_not_its_blocks():
    """A video's decode chunks (1 s each) are timed apart from its blocks (0.1 s): at its decode with 3 chunks (3 s)
    left it gives the device to an image with 2 s left. One average of both put it at 3 × 0.37 s, so it kept the
    device for its whole decode (the CPU bench's images waited a tiny video's decode: docs/benchmarks.md)."""
    device = stand_in(first_guess_s=1.0)
    scheduler = device.scheduler
    costs = [0.1] * 4 + [1.0] * 4
    with scheduler.turn("wan", len(costs), video=True, step_pieces=2, chunks=4) as turn:
        for piece, cost in enumerate(costs):
            device.log.append(("wan", device.clock()))
            device.clock.advance(cost)
            if piece == 4:  # after the decode's first chunk, an image of 2 pieces of 1 s (the first guess) arrives
                device.arrive(lambda: device.run("sdxl", 2, 1.0))
            turn.boundary(len(costs) - piece - 1)
    device.join()
    assert device.order == ["wan"] * 5 + ["sdxl"] * 2 + ["wan"] * 3
    assert scheduler.piece_s("wan") == pytest.approx(0.1) and scheduler.piece_s("wan decode") == pytest.approx(1.0)
