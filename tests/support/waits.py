"""Waiting on a state, never on a time (the house rule: the suite runs in CI's order on a loaded 2-core machine).

A test that must see something happen (a thread reach a point, a queue fill, a file go, a server answer) polls a
probe of that state; the deadline only ends a broken test, so it is generous and never reached when all is well.
The short pause between two reads is the poll's interval, not a guess at how long the state takes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 60.0  # a loaded CI machine is slow; a state that holds arrives long before this
POLL_S = 0.01


def wait_until(probe: Callable[[], T], what: str = "the state", timeout: float = WAIT_S, poll: float = POLL_S) -> T:
    """Poll `probe` until it returns a true value, and return that value; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)  # between two reads of the state, not a wait for it
    return value


async def until_async(probe: Callable[[], T], what: str = "the state", timeout: float = WAIT_S) -> T:
    """`wait_until` inside an event loop: yields to the loop between reads, so the tasks it waits on run."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)
    return value
