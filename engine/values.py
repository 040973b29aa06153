"""A request's numbers checked against their range, refusals naming the value and what is accepted: the one
place `engine.normalise` and `engine.video_checks` read whole numbers and numbers from."""

from __future__ import annotations

import math

from engine.errors import InvalidRequestError, LimitExceededError

__all__ = ["checked_int", "checked_number"]


def checked_int(name: str, value: object, default: int, low: int, high: int) -> int:
    """`value` as an integer within low..high (a float with nothing after the point is one); None: `default`.
    Over `high` is a LimitExceededError, anything else refused an InvalidRequestError."""
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name}={value!r} is not an integer; accepted: an integer from {low} to {high}")
    if not low <= value <= high:
        error = LimitExceededError if value > high else InvalidRequestError
        raise error(f"{name}={value} is out of range; accepted: an integer from {low} to {high}")
    return value


def checked_number(name: str, value: object, default: float, low: float, high: float) -> float:
    """`value` as a finite number within low..high; None: `default`."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{name}={value!r} is not a number; accepted: a number from {low:g} to {high:g}")
    if not low <= value <= high:
        raise InvalidRequestError(f"{name}={value:g} is out of range; accepted: a number from {low:g} to {high:g}")
    return float(value)
