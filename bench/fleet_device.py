"""A replica's GPU in the fleet model (bench/fleet_model.py), shared between its pools as the engine shares it.

The engine hands a device's time out per piece of work (`engine.pipeline.stepshare`, issue 48): a denoising step, or
one latent frame of a video VAE's decode. `SimDevice` is that scheduler on simpy's clock: a run holds the device for
one piece at a time and at each boundary between two pieces the device goes to whichever run the engine's own policy
picks (`stepshare.goes_next`: the least remaining device time, unless a run has waited longer than
`STEP_SHARING_STARVE_STEPS` of its own steps), each pool's time per piece and per decode chunk being the engine's
own estimate (`stepshare.PieceTimes`: a run's decode chunks, its last `chunks` pieces, timed apart from its
denoising pieces, as the engine's `turn(chunks=)`). How it is shared and the bound are read from the engine's
settings (`DEVICE_SHARING`, `STEP_SHARING_STARVE_STEPS`, resolved as for a persistent CUDA device: `auto` is step
sharing, ZeroGPU's per-call GPU the whole-run lock), never restated here. With `run` a run holds the device from its
first piece to its last (the whole-run lock; the next run is still the policy's pick); with `off` nothing waits for
the device (a GPU per pool). A pool runs one request at a time (the replica's pool slot, outside this device), as in
the engine. What a new run has ahead of it on the device is the engine's count too (`ahead_s`:
`stepshare.time_ahead`).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import simpy
import torch

from engine.pipeline.sharing import Sharing, sharing_mode
from engine.pipeline.stepshare import FIRST_GUESS_S, PieceTimes, goes_next, time_ahead
from engine.settings import Settings

__all__ = ["SimDevice", "SimRun", "image_pieces"]


def image_pieces(steps: int, step_s: float, decode_s: float = 0.0) -> list[float]:
    """An image run's pieces: its steps, then its VAE decode whole (the engine's last boundary is after the last
    step, before the decode; a decode folded into the steps is a piece of no time)."""
    return [step_s] * steps + [decode_s]


@dataclass(eq=False)
class SimRun:
    """One run on the simulated device (what `goes_next` reads, and what the run waited)."""

    seq: int
    pool: str
    remaining: int
    starve: float
    video: bool
    waiting_since: float | None = None
    # Its last pieces that are a VAE decode's (timed apart, as the engine's: `stepshare.left_s`).
    chunks: int = 0
    wake: simpy.Event | None = None
    started_s: float | None = None  # when it first held the device
    longest_wait_s: float = 0.0  # its longest wait for the device before a piece (the first included)
    pauses: int = 0


class SimDevice:
    """One GPU's pieces of work, handed out to its pools' runs (policy: module docstring)."""

    def __init__(
        self, env: simpy.Environment, sharing: Sharing, starve: float, first_guess_s: float = FIRST_GUESS_S
    ) -> None:
        self.env, self.sharing, self.starve = env, sharing, starve
        self._piece = PieceTimes(first_guess_s)
        self._holder: SimRun | None = None
        self._waiting: list[SimRun] = []
        self._seq = itertools.count(1)

    @classmethod
    def from_settings(cls, env: simpy.Environment, settings: Settings) -> SimDevice:
        """The device as `settings` share it, on a persistent GPU (the fleet's replicas each hold one)."""
        sharing = sharing_mode(settings.device_sharing, torch.device("cuda"), per_call=settings.per_call)
        return cls(env, sharing, settings.step_sharing_starve_steps)

    def run(
        self, pool: str, pieces: Sequence[float], *, video: bool, step_pieces: int = 1, chunks: int = 0
    ) -> Generator[simpy.Event, object, SimRun]:
        """A run of `pool` whose pieces take `pieces` seconds each of the device, a boundary between each two, its
        steps `step_pieces` pieces each (the starvation bound's unit), its last `chunks` its VAE decode's (timed
        apart), as the engine's `turn`: returns once its last one ends. (An image's decode is a piece of its own
        after its last step's boundary, as the engine's: `image_pieces`.)"""
        run = SimRun(next(self._seq), pool, max(len(pieces), 1), self.starve * step_pieces, video, chunks=chunks)
        if self.sharing == "off":
            run.started_s = self.env.now
            yield self.env.timeout(sum(pieces))
            return run
        yield from self._wait(run)
        for done, piece in enumerate(pieces, start=1):
            yield self.env.timeout(piece)
            self._piece.held(run, piece)  # begun with `run.remaining` left, as the engine times it
            run.remaining = max(len(pieces) - done, 1)  # counted under the whole-run lock too, as the engine's
            if done < len(pieces) and self.sharing == "step":
                yield from self._boundary(run, len(pieces) - done)
        self._holder = None
        self._hand_over()
        return run

    def _boundary(self, run: SimRun, remaining: int) -> Generator[simpy.Event, object, None]:
        """`run` has `remaining` pieces left: it keeps the device unless the policy picks a waiting run."""
        run.remaining = remaining
        if not self._waiting or goes_next(self._waiting, run, self.env.now, self._piece) is run:
            return
        run.pauses += 1
        self._holder = None
        yield from self._wait(run)

    def _wait(self, run: SimRun) -> Generator[simpy.Event, object, None]:
        run.waiting_since = self.env.now
        run.wake = self.env.event()
        self._waiting.append(run)
        self._hand_over()
        yield run.wake

    def _hand_over(self) -> None:
        """Give the free device to the waiting run that goes next."""
        if self._holder is not None or not self._waiting:
            return
        now = self.env.now
        chosen = goes_next(self._waiting, None, now, self._piece)
        self._waiting.remove(chosen)
        waited = now - (now if chosen.waiting_since is None else chosen.waiting_since)
        chosen.longest_wait_s = max(chosen.longest_wait_s, waited)
        if chosen.started_s is None:
            chosen.started_s = now
        chosen.waiting_since = None
        self._holder = chosen
        assert chosen.wake is not None
        chosen.wake.succeed()

    def ahead_s(self, pool: str, own_s: float) -> float:
        """The device time other pools' runs take before a new run of `pool` needing `own_s` ends, as the engine's
        scheduler counts it for queue places and Retry-After (`stepshare.time_ahead`): what the router reads."""
        runs = [*self._waiting, *([self._holder] if self._holder is not None else [])]
        return time_ahead(runs, pool, own_s, self._piece, whole_run=self.sharing == "run")

    @property
    def waiting(self) -> int:
        """Runs waiting for the device (paused or not yet started)."""
        return len(self._waiting)
