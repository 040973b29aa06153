"""The policy of the device's step sharing (`engine.pipeline.stepshare`, its module docstring), declared once for
the device scheduler and the fleet model's replica GPU (`bench.fleet_device`): which run goes next (`goes_next`),
a run's remaining device time (`left_s`), what a new run has ahead of it (`time_ahead`), and each pool's time per
piece and per decode chunk as its runs hold the device (`PieceTimes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

__all__ = ["FIRST_GUESS_S", "PieceTimes", "Waiter", "averaged", "decoding", "goes_next", "left_s", "time_ahead"]

# A pool's time per piece until one is measured (the fleet model's too: `bench.fleet_device`).
FIRST_GUESS_S = 1.0
# The weight of the newest piece in a pool's moving average.
_NEWEST = 0.3
# A pool's decode chunks are averaged under its name and this (`decoding`).
_DECODE = " decode"


class Waiter(Protocol):
    """What the policy reads of a run: a scheduler's own, or a model's (`bench.fleet_device`)."""

    @property
    def seq(self) -> int: ...
    @property
    def pool(self) -> str: ...
    @property
    def remaining(self) -> int: ...
    @property
    def chunks(self) -> int: ...
    @property
    def starve(self) -> float: ...
    @property
    def waiting_since(self) -> float | None: ...


W = TypeVar("W", bound=Waiter)


def decoding(pool: str) -> str:
    """The name `pool`'s decode chunks are timed under (apart from its denoising pieces)."""
    return pool + _DECODE


def left_s(run: Waiter, piece_s: Callable[[str], float]) -> float:
    """`run`'s remaining device time: its denoising pieces left × its pool's time per piece, and its decode chunks
    left (its last `chunks` pieces) × its pool's time per chunk."""
    chunks = min(run.chunks, run.remaining)
    return (run.remaining - chunks) * piece_s(run.pool) + chunks * piece_s(decoding(run.pool))


def goes_next(waiting: Sequence[W], holder: W | None, now: float, piece_s: Callable[[str], float]) -> W:
    """The run that goes next among `waiting` and `holder` at `now`, a pool's time per piece being `piece_s(pool)`:
    the policy of the module docstring, the one declaration of it (the device scheduler's and the fleet model's)."""

    def since(run: W) -> float:
        return now if run.waiting_since is None else run.waiting_since

    starved = [r for r in waiting if now - since(r) > r.starve * piece_s(r.pool)]
    if starved:
        return min(starved, key=lambda r: (since(r), r.seq))
    candidates = [*waiting, *([holder] if holder is not None else [])]
    return min(candidates, key=lambda r: (left_s(r, piece_s), r is not holder, r.seq))


def time_ahead(
    runs: Iterable[Waiter], pool: str, own_s: float, piece_s: Callable[[str], float], *, whole_run: bool = False
) -> float:
    """The device time other pools' `runs` (on the device or waiting for it) take before a new run of `pool` needing
    `own_s` ends: all of a run with less left (it goes first), at most `own_s` of a longer one (its pieces interleave
    with the new run's once it has waited its bound, until the new run ends). Under the whole-run lock
    (`whole_run`) nothing interleaves: all of the run holding the device (`waiting_since` None: it keeps it to its
    end) and of a waiting run with less left, nothing of a longer waiting one (the new run goes before it). The one
    declaration of it (the device scheduler's queue places and Retry-After, and the fleet model's router:
    `bench.fleet_device`)."""
    total = 0.0
    for run in runs:
        if run.pool == pool:
            continue
        left = left_s(run, piece_s)
        if not whole_run:
            total += min(left, own_s)
        elif run.waiting_since is None or left < own_s:
            total += left
    return total


def averaged(known: float | None, piece: float) -> float:
    """A pool's time per piece once it has held the device for `piece` more seconds: a moving average."""
    return piece if known is None else (1 - _NEWEST) * known + _NEWEST * piece


class PieceTimes:
    """Each pool's time per piece and per decode chunk as its runs hold the device (moving averages: `averaged`):
    `first_guess_s` for a pool's piece until one is measured, its piece's for a chunk until a chunk is. Not locked:
    its owner's lock guards it (the scheduler's; the fleet model's one simpy thread)."""

    def __init__(self, first_guess_s: float = FIRST_GUESS_S) -> None:
        self._first_guess_s = first_guess_s
        self._s: dict[str, float] = {}

    def held(self, run: Waiter, piece: float) -> None:
        """`run` has held the device for `piece` seconds, a piece it began with `run.remaining` left: a decode
        chunk when those were all chunks. A piece of no time (a boundary just before the run's end) is no measure."""
        if piece <= 0:
            return
        key = decoding(run.pool) if run.remaining <= run.chunks else run.pool
        self._s[key] = averaged(self._s.get(key), piece)

    def __call__(self, pool: str) -> float:
        """`pool`'s time per piece (a `decoding` name: per chunk)."""
        known = self._s.get(pool)
        if known is None and pool.endswith(_DECODE):
            known = self._s.get(pool.removesuffix(_DECODE))
        return self._first_guess_s if known is None else known

    def measured(self, pool: str) -> float | None:
        """`pool`'s measured time per piece (None: not yet measured)."""
        return self._s.get(pool)
