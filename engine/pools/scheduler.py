"""One queue per pipeline, for every transport: admission to the GPU slot, and preparation ahead of it.

Every transport queues here: one limit (`MAX_QUEUE`; beyond it `EngineBusyError`, 503 with `Retry-After`), one
position shown to every client, one run at a time in the slot. A queued request is prepared at once on bounded
threads (a failed preparation leaves the queue, costing the GPU nothing); only a ready request is admitted, the
oldest unless a younger one needs the set already fused (affinity), and none is overtaken more than
`AFFINITY_MAX_SKIP` times. No waiter polls or holds a thread; a cancel leaves at once. `SCHEDULER=fifo_inline`
is the benchmark's baseline. Every decision is logged with its timings; the policy in full, after vLLM's
scheduler: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Generic, TypeVar, overload

from engine.errors import EngineBusyError, GenerationCancelledError
from engine.pools.tickets import Prepare, QueueView, Ticket, TicketState, waker
from engine.requests import GenerateRequest

__all__ = ["MODES", "QueueView", "Scheduler", "Ticket", "TicketState"]

logger = logging.getLogger(__name__)

MODES = ("affinity", "fifo_inline")
P = TypeVar("P")
Q = TypeVar("Q")
# A first guess at one run's length for Retry-After, until a run has been measured.
_FIRST_RUN_S = 2.0


class Scheduler(Generic[P]):
    """The queue and the GPU slot of one pipeline (see the module docstring for the policy)."""

    def __init__(
        self,
        *,
        prepare: Callable[[GenerateRequest], tuple[P, Callable[[], None]]],
        identity: Callable[[P], Hashable],
        fused: Callable[[], Hashable],
        max_queue: int,
        max_skip: int,
        threads: int,
        mode: str = "affinity",
        device_ahead: Callable[[float], float] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not accepted; accepted: {', '.join(MODES)}")
        self._prepare = prepare
        self._identity = identity
        self._fused = fused
        self.max_queue = max_queue
        self.max_skip = max_skip
        self.mode = mode
        self._device_ahead = device_ahead  # other pools' device time in a run's way (`_device_s`)
        self._cond = threading.Condition()
        # Tickets of this scheduler's own preparation hold a P; a ticket with its own preparation, whatever it makes.
        self._queue: list[Ticket[Any]] = []
        self._running: Ticket[Any] | None = None
        self._seq = itertools.count(1)
        self._wakers: list[Callable[[], None]] = []
        self._closed = False
        self._run_s = _FIRST_RUN_S
        self._max_overtaken = 0
        # One preparation per queued request at most, so this pool cannot be exhausted by waiting requests (and
        # room for preparations still finishing after their request left); the loads themselves are bounded
        # separately (engine.prepare.loadgate). Prefetches never run here (engine.pools.prefetch).
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prepare")

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, request: GenerateRequest, prepare: Prepare[Any] | None = None) -> Ticket[Any]:
        """Queue `request` and start its preparation (its own `prepare` if given, else the scheduler's); raises
        EngineBusyError when MAX_QUEUE are waiting already, before anything is prepared or downloaded."""
        now = time.perf_counter()
        with self._cond:
            waiting = len(self._queue)
            if self._closed:
                raise EngineBusyError("the engine is shutting down; accepted: requests to a running engine")
            if waiting >= self.max_queue:
                retry = max(1, math.ceil(self._device_s(waiting + 1)))
                logger.warning(
                    "rejected a request: %d waiting, limit %d (retry after %d s)", waiting, self.max_queue, retry
                )
                raise EngineBusyError(
                    f"the engine is busy ({waiting} requests waiting, limit {self.max_queue}); try again shortly",
                    retry_after_s=retry,
                )
            ticket: Ticket[Any] = Ticket(next(self._seq), request, now, prepare or partial(self._prepare, request))
            ticket.affine = prepare is None
            if self.mode == "fifo_inline":
                # Prepared inside the slot, as before this scheduler.
                ticket.state = TicketState.READY
                ticket.ready_at = now
            self._queue.append(ticket)
            position = len(self._queue)
        logger.info(
            "queued #%d at position %d (%d LoRAs, %s)",
            ticket.seq,
            position,
            len(request.loras),
            "preparing" if ticket.state is TicketState.PREPARING else "prepared in the slot",
        )
        if ticket.state is TicketState.PREPARING:
            self._pool.submit(self._prepare_ticket, ticket)
        self._dispatch()
        return ticket

    def _prepare_ticket(self, ticket: Ticket[Any]) -> None:
        with self._cond:
            if ticket.state is not TicketState.PREPARING:
                return
        started = time.perf_counter()
        try:
            prepared, release = ticket.prepare()
            identity = self._identity(prepared) if ticket.affine else None
        except BaseException as e:  # handed to the waiter, who raises it: nothing is swallowed
            with self._cond:
                elapsed = time.perf_counter() - started
                if ticket.state is TicketState.PREPARING:
                    self._remove(ticket)
                    ticket.state, ticket.error = TicketState.FAILED, e
            logger.warning(
                "preparation of #%d failed after %.3f s (%s: %s); it leaves the queue",
                ticket.seq,
                elapsed,
                type(e).__name__,
                e,
            )
            self._changed()
            return
        done = time.perf_counter()
        with self._cond:
            keep = ticket.state is TicketState.PREPARING
            if keep:
                ticket.state, ticket.prepared, ticket.release = TicketState.READY, prepared, release
                ticket.identity = identity
                ticket.prepare_s, ticket.ready_at = done - started, done
        if not keep:
            release()  # cancelled while it was being prepared
            return
        logger.info(
            "prepared #%d in %.3f s (%.3f s after it was queued)", ticket.seq, done - started, done - ticket.submitted
        )
        self._dispatch()
        self._changed()

    # -- admission -------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand the free slot to one request, if any may have it (the policy: module docstring)."""
        with self._cond:
            if self._running is not None or self._closed:
                return
            chosen = self._choose()
            if chosen is None:
                return
            now = time.perf_counter()
            overtaken = []
            for ticket in self._queue:
                if ticket is chosen:
                    break
                if ticket.state is TicketState.READY:
                    ticket.overtaken += 1
                    self._max_overtaken = max(self._max_overtaken, ticket.overtaken)
                    overtaken.append(ticket)
                else:
                    ticket.passed_while_preparing += 1
            self._remove(chosen)
            chosen.state, chosen.admitted_at = TicketState.RUNNING, now
            self._running = chosen
            waiting = len(self._queue)
        for ticket in overtaken:
            logger.info(
                "#%d overtook #%d (%s), which has been ready for %.3f s: overtaken %d of at most %d times",
                chosen.seq,
                ticket.seq,
                "its set is fused" if chosen.affinity else "it is older",
                now - (ticket.ready_at or now),
                ticket.overtaken,
                self.max_skip,
            )
        logger.info(
            "admitted #%d after %.3f s in the queue (ready for %.3f s)%s; %d overtaken, %d waiting",
            chosen.seq,
            now - chosen.submitted,
            now - (chosen.ready_at or now),
            ", its set is fused: no swap" if chosen.affinity else "",
            len(overtaken),
            waiting,
        )
        self._changed()

    def _choose(self) -> Ticket[Any] | None:
        ready = [t for t in self._queue if t.state is TicketState.READY]
        if not ready:
            return None
        if self.mode == "fifo_inline":
            return self._queue[0]
        # No one may pass a ready request that has been overtaken max_skip times already.
        limit = next((i for i, t in enumerate(ready) if t.overtaken >= self.max_skip), len(ready) - 1)
        candidates = ready[: limit + 1]
        fused = self._fused()
        for ticket in candidates:
            if ticket.identity is not None and ticket.identity == fused:
                ticket.affinity = True
                return ticket
        return candidates[0]

    async def wait(
        self,
        ticket: Ticket[Any],
        on_update: Callable[[QueueView], None] | None = None,
        shown: QueueView | None = None,
    ) -> None:
        """Wait until `ticket` holds the slot, holding no thread; raises its preparation error, and a cancelled
        task leaves the queue. `on_update` hears each place in the queue that differs from the last `shown`."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                woken: asyncio.Future[None] = loop.create_future()
                with self._cond:
                    if self._settled(ticket):
                        return
                    view = self._view(ticket)
                    self._wakers.append(waker(loop, woken))
                if on_update is not None and view != shown:
                    on_update(view)
                    shown = view
                await woken
        except asyncio.CancelledError:
            self.cancel(ticket)
            raise

    def _settled(self, ticket: Ticket[Any]) -> bool:
        """True once `ticket` holds the slot; raises if it failed or was cancelled (caller holds the lock)."""
        if ticket.state is TicketState.RUNNING:
            return True
        if ticket.state is TicketState.FAILED and ticket.error is not None:
            raise ticket.error
        if ticket.state is TicketState.CANCELLED:
            raise GenerationCancelledError("the request was cancelled while waiting in the queue")
        return False

    def _prepare_in_slot(self, ticket: Ticket[Any]) -> Any:
        """`fifo_inline` mode: the admitted request is prepared here, inside the slot, as before the scheduler."""
        started = time.perf_counter()
        prepared, release = ticket.prepare()
        with self._cond:
            ticket.prepared, ticket.release = prepared, release
            ticket.prepare_s = time.perf_counter() - started
        logger.info("prepared #%d inside the slot in %.3f s", ticket.seq, ticket.prepare_s)
        return prepared

    @overload
    def turn(
        self, request: GenerateRequest, on_queue: Callable[[QueueView], None] | None = None
    ) -> AbstractAsyncContextManager[P]: ...

    @overload
    def turn(
        self, request: GenerateRequest, on_queue: Callable[[QueueView], None] | None = None, *, prepare: Prepare[Q]
    ) -> AbstractAsyncContextManager[Q]: ...

    def turn(
        self,
        request: GenerateRequest,
        on_queue: Callable[[QueueView], None] | None = None,
        *,
        prepare: Prepare[Any] | None = None,
    ) -> AbstractAsyncContextManager[Any]:
        """A request's one way through: queued (EngineBusyError when full, before anything is downloaded), waited
        for without a thread, then the slot held, with the prepared work, inside the block; left (slot freed,
        leases released) after.

        The work is `request` prepared by the scheduler's own preparation, or what `prepare` makes (a comparison
        grid's cells, prepared on the same bounded threads, all in the one turn). `on_queue` hears the place the
        request joined at first, then each new one. Cancelling the task leaves the queue; a run under way is its
        holder's to stop. In `fifo_inline` mode the work is prepared on entering the block, inside the slot (in
        a worker thread, never on the event loop).
        """
        return self._turn(request, on_queue, prepare)

    @asynccontextmanager
    async def _turn(
        self, request: GenerateRequest, on_queue: Callable[[QueueView], None] | None, prepare: Prepare[Any] | None
    ) -> AsyncIterator[Any]:
        ticket = self.submit(request, prepare)
        try:
            joined = self.view(ticket)
            if on_queue is not None:
                on_queue(joined)
            await self.wait(ticket, on_queue, joined)
            with self._cond:
                prepared = ticket.prepared
            if prepared is None:
                prepared = await asyncio.to_thread(self._prepare_in_slot, ticket)
            yield prepared
        finally:
            self.finish(ticket)

    def finish(self, ticket: Ticket[Any]) -> None:
        """Leave: free the slot (after a result or an error) and release the adapters; dequeue if still queued."""
        now = time.perf_counter()
        with self._cond:
            if ticket.state in (TicketState.PREPARING, TicketState.READY):
                queued = True
            elif self._running is not ticket:
                return
            else:
                queued = False
        if queued:
            self.cancel(ticket)
            return
        with self._cond:
            if self._running is not ticket:
                return
            self._running = None
            ticket.state = TicketState.DONE
            ran = now - (ticket.admitted_at or now)
            # A moving average of run lengths, for Retry-After.
            self._run_s = 0.8 * self._run_s + 0.2 * ran
            release, ticket.release = ticket.release, None
        logger.info("finished #%d: %.3f s in the slot, %.3f s since queued", ticket.seq, ran, now - ticket.submitted)
        if release is not None:
            release()
        self._dispatch()
        self._changed()

    def cancel(self, ticket: Ticket[Any]) -> None:
        """Take `ticket` out of the queue if it is still queued; a running one is its holder's to `finish`."""
        with self._cond:
            state = ticket.state
            if state not in (TicketState.PREPARING, TicketState.READY):
                return
            self._remove(ticket)
            ticket.state = TicketState.CANCELLED
            release, ticket.release = ticket.release, None
        logger.info("cancelled #%d after %.3f s in the queue", ticket.seq, time.perf_counter() - ticket.submitted)
        if release is not None:
            release()
        self._changed()
        self._dispatch()

    # -- state -----------------------------------------------------------------------------------

    def view(self, ticket: Ticket[Any]) -> QueueView:
        with self._cond:
            return self._view(ticket)

    def _view(self, ticket: Ticket[Any]) -> QueueView:
        position = next((i + 1 for i, t in enumerate(self._queue) if t is ticket), 0)
        # Those queued before it, and the one on the GPU: a request that joins an idle pool has none ahead.
        ahead = max(position - 1, 0) + int(position > 0 and self._running is not None)
        device_s = round(self._device_s(ahead + 1)) if position else 0
        return QueueView(position, len(self._queue), ticket.state.value, ahead, device_s)

    @property
    def waiting(self) -> int:
        """Requests in the queue (preparing or ready), the one running not counted."""
        with self._cond:
            return len(self._queue)

    @property
    def max_overtaken(self) -> int:
        """The most times any request has been overtaken while ready (never above `max_skip`)."""
        with self._cond:
            return self._max_overtaken

    def close(self) -> None:
        """Refuse new requests and stop the preparation pool (preparations under way finish)."""
        with self._cond:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _remove(self, ticket: Ticket[Any]) -> None:
        self._queue = [t for t in self._queue if t is not ticket]

    def _device_s(self, runs: int) -> float:
        """Device time until `runs` runs of this pool end, other pools' in their way too (`DeviceScheduler.ahead_s`)."""
        own = self._run_s * runs
        return own + (self._device_ahead(own) if self._device_ahead is not None else 0.0)

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()
