"""A request's place in the scheduler's queue (`engine.pools.scheduler`): its ticket, state and the view clients see."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.requests import GenerateRequest

__all__ = ["Prepare", "QueueView", "Ticket", "TicketState", "waker"]

logger = logging.getLogger(__name__)

P = TypeVar("P")


class TicketState(enum.Enum):
    PREPARING = "preparing"
    READY = "ready"
    RUNNING = "running"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DONE = "done"


@dataclass(frozen=True)
class QueueView:
    """Where a request stands, as every transport shows it: 1-based place among those waiting (0: running), and
    how many requests go to the GPU before it (the one running counted; 0: it goes next, the slot is free); about
    how many seconds of device time until it is done (`device_s`, whole seconds: those ahead of it and its own run
    at the pool's measured run length, and the other pools' runs it goes after or interleaves with)."""

    position: int
    waiting: int
    state: str
    ahead: int = 0
    device_s: float = 0.0


# How a ticket is prepared: the prepared work, and what releases its adapters once it has run.
Prepare = Callable[[], tuple[P, Callable[[], None]]]


class Ticket(Generic[P]):
    """One request's place in the queue. Its fields are the scheduler's, read and written under its lock.

    `prepare` is the ticket's own preparation (a comparison grid prepares all its cells in one ticket); the
    scheduler's own is used when there is none. `identity` is the prepared set's, for affinity (None: never).
    """

    def __init__(self, seq: int, request: GenerateRequest, submitted: float, prepare: Prepare[P]) -> None:
        self.seq = seq
        self.request = request
        self.submitted = submitted
        self.prepare = prepare
        # Whether the prepared set's identity decides affinity (a grid's cells are several sets: it never does).
        self.affine = True
        self.identity: Hashable | None = None
        self.state = TicketState.PREPARING
        self.prepared: P | None = None
        self.release: Callable[[], None] | None = None
        self.error: BaseException | None = None
        self.prepare_s = 0.0
        self.ready_at: float | None = None
        self.admitted_at: float | None = None
        self.overtaken = 0
        self.passed_while_preparing = 0
        self.affinity = False

    def __repr__(self) -> str:
        return f"Ticket(#{self.seq}, {self.state.value})"


def waker(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    """What wakes a waiter's future on its own loop, from any thread (a loop already closed is let be)."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(_resolve, future)
        except RuntimeError:
            logger.debug("a queued request's event loop closed before it was woken")

    return wake


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
