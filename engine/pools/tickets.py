"""A request's place in the scheduler's queue (`engine.pools.scheduler`): its ticket, state and the view clients see."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.requests import GenerateRequest

__all__ = ["QueueView", "Ticket", "TicketState"]

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
    """Where a request stands, as every transport shows it: 1-based place among those waiting (0: running)."""

    position: int
    waiting: int
    state: str


class Ticket(Generic[P]):
    """One request's place in the queue. Its fields are the scheduler's, read and written under its lock."""

    def __init__(self, seq: int, request: GenerateRequest, submitted: float) -> None:
        self.seq = seq
        self.request = request
        self.submitted = submitted
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
