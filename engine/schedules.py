"""A LoRA's strength by step: piecewise-constant schedules, checked once and read by the run.

A schedule is `((from, scale), ...)`: `from` a fraction of the run's steps, the first 0, each after it larger, at
most 1. **The rule:** with N steps, step i runs at the scale of the last segment whose `from` ≤ i / N (so over 4
steps `((0, 1.0), (0.5, 0.0))` runs steps 0-1 at 1.0 and steps 2-3 at 0). The short form `start`/`end` beside a
scale is the scale on [start, end) and 0 elsewhere. The text encoders run once, before step 0: their part of a
LoRA takes the value at step 0 (the request's `scale` once checked). `check_schedule` is what
`engine.normalise` applies to every door's request; `scale_at` is the one reading of the rule (the engine's
step boundaries and the tests' references both use it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from engine.errors import InvalidRequestError, LimitExceededError
from engine.requests import SCALE_RANGE, LoraSpec

__all__ = [
    "Schedule",
    "check_schedule",
    "check_window",
    "checked_spec",
    "from_window",
    "scale_at",
    "scales_at",
    "schedule_fields",
    "strength_text",
    "window_of",
]

A = TypeVar("A")

# ((from, scale), ...); empty: no schedule (the constant `scale`).
Schedule = tuple[tuple[float, float], ...]

# Far below 1 / MAX_STEPS' ceiling (500), far above a float's error on a fraction.
_TOLERANCE = 1e-9
_ACCEPTED = (
    "a list of [from, scale] pairs, from a fraction of the steps: the first 0, each larger than the one before, "
    "at most 1"
)


def scale_at(schedule: Schedule, step: int, steps: int) -> float:
    """The scale of step `step` (0-based) of a run of `steps` steps: the last segment whose from ≤ step / steps.

    With a tolerance far below one step: 0.1 as sent is the binary float just over 1/10, and step 1 of 10 is on it."""
    where = step / max(steps, 1) + _TOLERANCE
    return next((scale for start, scale in reversed(schedule) if start <= where), schedule[0][1])


def scales_at(
    loras: Sequence[LoraSpec], adapters: Sequence[tuple[A, float, float | None]], step: int, steps: int
) -> list[tuple[A, float, float | None]]:
    """The (adapter, scale, scale_2) set of step `step` of `steps`, `adapters` those of the checked `loras` in order.

    The high-noise side (every side of a one-transformer pool) takes `schedule`, or `scale`; the low-noise side
    `schedule_2`, else `scale_2`, else the high-noise side's. A low-noise scale equal to the other is None (one set
    of scales, as `engine.normalise` leaves a request's)."""
    stepped: list[tuple[A, float, float | None]] = []
    for spec, (adapter, *_) in zip(loras, adapters, strict=True):
        scale = scale_at(spec.schedule, step, steps) if spec.schedule else spec.scale
        scale_2 = scale_at(spec.schedule_2, step, steps) if spec.schedule_2 else spec.scale_2
        stepped.append((adapter, scale, None if scale_2 == scale else scale_2))
    return stepped


def checked_spec(spec: LoraSpec, limit: int) -> LoraSpec:
    """`spec` (its scales checked) with its schedules checked: the short form made a `schedule` (and, with a
    `scale_2`, a `schedule_2` of the same window), `scale` and `scale_2` their schedules' step-0 values, a schedule
    of one scale left as that scale; beside a high-noise schedule, a constant `scale_2` stays the low-noise side's
    (a `schedule_2` of one segment)."""
    window = spec.start is not None or spec.end is not None
    if window and spec.schedule:
        raise InvalidRequestError(
            f"{spec.ref} has both a schedule and start/end; accepted: one of them (start/end is the short form)"
        )
    schedule_2 = check_schedule(f"schedule_2 of {spec.ref}", spec.schedule_2, limit, SCALE_RANGE)
    if window:
        start, end = check_window(spec.ref, spec.start, spec.end)
        schedule = from_window(spec.scale, start, end)
        if spec.scale_2 is not None and not schedule_2:
            schedule_2 = from_window(spec.scale_2, start, end)
    else:
        schedule = check_schedule(f"schedule of {spec.ref}", spec.schedule, limit, SCALE_RANGE)
    if len(schedule) > 1 and not schedule_2 and spec.scale_2 is not None:
        schedule_2 = ((0.0, spec.scale_2),)
    keep_2 = len(schedule_2) > 1 or (len(schedule) > 1 and bool(schedule_2))
    return replace(
        spec,
        scale=schedule[0][1] if schedule else spec.scale,
        scale_2=schedule_2[0][1] if schedule_2 else spec.scale_2,
        schedule=schedule if len(schedule) > 1 else (),
        start=None,
        end=None,
        schedule_2=schedule_2 if keep_2 else (),
    )


def from_window(scale: float, start: float, end: float) -> Schedule:
    """The short form: `scale` on [start, end), 0 elsewhere (as segments, without empty or repeated ones)."""
    segments = [(0.0, 0.0), (start, scale)] if start > 0 else [(0.0, scale)]
    if end < 1:
        segments.append((end, 0.0))
    return _merged(tuple(segments))


def window_of(schedule: Schedule) -> tuple[float, float, float] | None:
    """`schedule` as the short form's (scale, start, end) when it is one (a scale on [start, end), 0 elsewhere, as
    `from_window` makes it); None for any other schedule."""
    on = [i for i, (_, value) in enumerate(schedule) if value != 0]
    if len(on) != 1:
        return None
    start, scale = schedule[on[0]]
    end = schedule[on[0] + 1][0] if on[0] + 1 < len(schedule) else 1.0
    return (scale, start, end) if from_window(scale, start, end) == schedule else None


def strength_text(spec: LoraSpec) -> str:
    """A LoRA's strength as the UI shows it (a comparison cell's caption, a result's info), the same before and after
    the check: its scale (`0.8`), its window (`0.8 from 0 to 0.5`: the scale on those steps, 0 elsewhere), or its
    schedule's segments (`0@0.4 0.5@0.9`: each from@scale). ASCII, so any font draws it (the grid's labels)."""
    if spec.start is not None or spec.end is not None:
        return f"{_g(spec.scale)} from {_g(spec.start or 0)} to {_g(1 if spec.end is None else spec.end)}"
    # An unchecked schedule (a comparison labels its cells before they are checked) is shown only when well-formed.
    if not all(isinstance(pair, tuple | list) and len(pair) == 2 and all(map(_finite, pair)) for pair in spec.schedule):
        return _g(spec.scale)
    schedule = tuple((float(start), float(value)) for start, value in spec.schedule)
    if (window := window_of(schedule)) is not None:
        return "{:g} from {:g} to {:g}".format(*window)
    return " ".join(f"{start:g}@{value:g}" for start, value in schedule) or _g(spec.scale)


def schedule_fields(spec: LoraSpec) -> dict[str, list[list[float]]]:
    """A checked LoRA's schedules as `parameters.loras[i]` takes them over HTTP (`schedule`, `schedule_2`: each
    `[[from, scale], ...]`), only those it has: a result's info says them beside the step-0 `scale`, and sending them
    back runs the same steps (a window is its long form, `from_window`'s)."""
    named = (("schedule", spec.schedule), ("schedule_2", spec.schedule_2))
    return {name: [[start, scale] for start, scale in schedule] for name, schedule in named if schedule}


def _g(value: object) -> str:
    """A number as `:g` writes it; anything else (a value the check will refuse by name) as Python writes it."""
    return f"{value:g}" if _finite(value) else repr(value)


def check_schedule(where: str, value: object, limit: int, scale_range: tuple[float, float]) -> Schedule:
    """`value` (a door's list of [from, scale] pairs) checked: each pair two finite numbers, the froms from 0,
    increasing, at most 1, the scales within `scale_range`, at most `limit` segments. Runs of one scale merge."""
    if value is None or value == () or value == []:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"{where}={value!r} is not accepted; accepted: {_ACCEPTED}")
    if len(value) > limit:
        raise LimitExceededError(
            f"{where} has {len(value)} segments; accepted: at most {limit} (MAX_SCHEDULE_SEGMENTS)"
        )
    segments: list[tuple[float, float]] = []
    for pair in value:
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(_finite(x) for x in pair):
            raise InvalidRequestError(f"{where} holds {pair!r}; accepted: {_ACCEPTED}, each a finite number")
        start, scale = float(pair[0]), float(pair[1])
        if not 0 <= start <= 1:
            raise InvalidRequestError(f"{where} starts a segment at {start:g}, outside [0, 1]; accepted: {_ACCEPTED}")
        if segments and start <= segments[-1][0]:
            raise InvalidRequestError(
                f"{where} starts a segment at {start:g} after one at {segments[-1][0]:g}: not increasing; "
                f"accepted: {_ACCEPTED}"
            )
        if not segments and start != 0:
            raise InvalidRequestError(f"{where} begins at {start:g}, not 0; accepted: {_ACCEPTED}")
        low, high = scale_range
        if not low <= scale <= high:
            raise InvalidRequestError(
                f"{where} has the scale {scale:g} at {start:g}; accepted: scales from {low:g} to {high:g}"
            )
        segments.append((start, scale))
    return _merged(tuple(segments))


def check_window(where: str, start: object, end: object) -> tuple[float, float]:
    """The short form's `start` and `end` (None: 0 and 1): fractions of the steps, 0 ≤ start < end ≤ 1."""
    values = []
    for name, value, default in (("start", start, 0.0), ("end", end, 1.0)):
        if value is None:
            values.append(default)
            continue
        if not _finite(value) or not 0 <= float(value) <= 1:  # type: ignore[arg-type]
            raise InvalidRequestError(
                f"{name}={value!r} of {where} is not accepted; accepted: a fraction of the steps from 0 to 1"
            )
        values.append(float(value))  # type: ignore[arg-type]
    low, high = values
    if low >= high:
        raise InvalidRequestError(
            f"start={low:g} and end={high:g} of {where} leave no step; accepted: 0 ≤ start < end ≤ 1"
        )
    return low, high


def _merged(segments: Schedule) -> Schedule:
    """`segments` with each run of one scale as one segment."""
    merged: list[tuple[float, float]] = []
    for start, scale in segments:
        if not merged or merged[-1][1] != scale:
            merged.append((start, scale))
    return tuple(merged)


def _finite(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
