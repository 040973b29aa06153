"""The scheduler's policy on its own, with preparations the test controls: FIFO, affinity, the overtake bound
under adversarial arrival orders, preparation before admission, failures, cancellation, the one limit, and
async waiting that holds no thread. The bound is checked from the order of admissions the test records, not
from the scheduler's own counters.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from engine.errors import EngineBusyError, GenerationCancelledError, LoraNotFoundError
from engine.pipeline.stepshare import DeviceScheduler
from engine.pools.scheduler import Scheduler, Ticket, TicketState
from engine.prepare.loadgate import LoadGate
from engine.requests import GenerateRequest
from tests.support.stepshare import Clock, started
from tests.support.waits import until_async, wait_until

WAIT_S = 30.0


@dataclass
class Harness:
    """A scheduler whose preparations block until the test lets them finish, and whose "GPU" is the test."""

    max_skip: int
    max_queue: int = 64
    mode: str = "affinity"
    fused: str = ""
    gates: dict[str, threading.Event] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    prepared_in: dict[str, str] = field(default_factory=dict)
    admitted: list[Ticket] = field(default_factory=list)
    ready_since: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.scheduler: Scheduler[tuple[str, str]] = Scheduler(
            prepare=self._prepare,
            identity=lambda prepared: prepared[1],
            fused=lambda: self.fused,
            max_queue=self.max_queue,
            max_skip=self.max_skip,
            threads=self.max_queue + 2,
            mode=self.mode,
        )

    def _prepare(self, request: GenerateRequest) -> tuple[tuple[str, str], Callable[[], None]]:
        name, adapter_set = request.prompt, request.negative_prompt
        with self.lock:
            gate = self.gates.setdefault(name, threading.Event())
            self.prepared_in[name] = threading.current_thread().name
        assert gate.wait(WAIT_S), f"{name} was never let through"
        if name in self.failures:
            raise self.failures[name]
        return (name, adapter_set), lambda: self.released.append(name)

    def submit(self, name: str, adapter_set: str, *, ready: bool = True) -> Ticket:
        with self.lock:
            gate = self.gates.setdefault(name, threading.Event())
        if ready:
            gate.set()
        ticket = self.scheduler.submit(GenerateRequest(prompt=name, negative_prompt=adapter_set))
        if ready and self.mode == "affinity":
            wait_until(lambda: ticket.state is not TicketState.PREPARING, f"{ticket} prepared", WAIT_S)
        return ticket

    def let_through(self, name: str, ticket: Ticket) -> None:
        self.gates[name].set()
        wait_until(lambda: ticket.state is not TicketState.PREPARING, f"{ticket} prepared", WAIT_S)

    def run_next(self) -> Ticket:
        """Take the request the scheduler admitted, 'run' it (its set becomes the fused one), and finish it."""
        running = wait_until(lambda: self.scheduler._running, "an admitted request", WAIT_S)
        # What `Scheduler.turn` hands its holder (prepared inside the slot in `fifo_inline` mode).
        prepared = running.prepared or self.scheduler._prepare_in_slot(running)
        self.admitted.append(running)
        self.fused = prepared[1]
        self.scheduler.finish(running)
        return running


@pytest.fixture
def harness() -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def build(**kwargs: object) -> Harness:
        made.append(Harness(**kwargs))
        return made[-1]

    yield build
    for h in made:
        for gate in h.gates.values():
            gate.set()
        h.scheduler.close()


def test_admission_is_fifo_when_affinity_is_off(harness):
    h = harness(max_skip=0)
    holder = h.submit("holder", "A")
    queued = [h.submit(f"r{i}", "AB"[i % 2]) for i in range(8)]
    assert [h.scheduler.view(t).position for t in queued] == list(range(1, 9))
    for _ in range(9):
        h.run_next()
    assert h.admitted == [holder, *queued]


def test_a_request_for_the_fused_set_goes_first(harness):
    h = harness(max_skip=3)
    h.submit("holder", "A")
    b1, a1, b2, a2 = h.submit("b1", "B"), h.submit("a1", "A"), h.submit("b2", "B"), h.submit("a2", "A")
    for _ in range(5):
        h.run_next()
    # A stays fused for a1 and a2 (no swap), then one swap to B serves b1 and b2.
    assert h.admitted[1:] == [a1, a2, b1, b2]
    assert a1.affinity and a2.affinity and b2.affinity
    assert b1.overtaken == 2 and b2.overtaken == 1


def overtakes_seen(admitted: list[Ticket]) -> dict[int, int]:
    """From when each request became ready and was admitted: how often a younger one went first meanwhile."""
    counts: dict[int, int] = {}
    for ticket in admitted:
        counts[ticket.seq] = sum(
            1
            for other in admitted
            if other.seq > ticket.seq and ticket.ready_at < other.admitted_at < ticket.admitted_at
        )
    return counts


@pytest.mark.parametrize("max_skip", [0, 1, 3])
def test_the_bound_holds_under_adversarial_arrival_orders(harness, max_skip):
    for seed in range(12):
        rng = random.Random(seed * 31 + max_skip)
        h = harness(max_skip=max_skip)
        h.submit("holder", "A")
        pending: list[tuple[str, Ticket]] = []
        for step in range(40):
            # The adversary: a stream of requests for whatever is fused, against a few old other-set ones,
            # with preparations finishing in a random order.
            if rng.random() < 0.7:
                adapter_set = h.fused if rng.random() < 0.75 else rng.choice("ABC")
                ready = rng.random() < 0.7
                name = f"s{seed}-{step}"
                ticket = h.submit(name, adapter_set or "A", ready=ready)
                if not ready:
                    pending.append((name, ticket))
            if pending and rng.random() < 0.3:
                name, ticket = pending.pop(rng.randrange(len(pending)))
                h.let_through(name, ticket)
            if h.scheduler._running is not None:
                h.run_next()
        for name, ticket in pending:
            h.let_through(name, ticket)
        while h.scheduler.waiting or h.scheduler._running is not None:
            h.run_next()
        seen = overtakes_seen(h.admitted)
        assert max(seen.values(), default=0) <= max_skip, (seed, seen)
        assert h.scheduler.max_overtaken <= max_skip
        if max_skip > 0:
            # The adversary does get requests through by affinity: the bound is reached, not avoided.
            assert any(t.affinity for t in h.admitted)


def test_an_old_request_is_overtaken_exactly_the_bound_then_runs(harness):
    h = harness(max_skip=3)
    h.submit("holder", "A")
    old = h.submit("old", "B")
    stream = [h.submit(f"a{i}", "A") for i in range(6)]
    for _ in range(8):
        h.run_next()
    assert h.admitted[1:] == [*stream[:3], old, *stream[3:]]
    assert old.overtaken == 3


def test_only_a_prepared_request_holds_the_slot_and_a_preparing_one_loses_no_place(harness):
    h = harness(max_skip=0)
    h.submit("holder", "A")
    cold = h.submit("cold", "B", ready=False)
    warm = [h.submit(f"w{i}", "A") for i in range(3)]
    for _ in range(4):
        h.run_next()
    assert cold not in h.admitted and cold.state is TicketState.PREPARING
    assert cold.passed_while_preparing == 3 and cold.overtaken == 0
    h.submit("busy", "A")  # holds the slot
    late = h.submit("late", "A")
    h.let_through("cold", cold)
    for _ in range(3):
        h.run_next()
    # Once ready it is the oldest: it goes before the younger ready one, fused set or not.
    assert h.admitted[-2:] == [cold, late]
    assert h.admitted[1:4] == warm


def test_a_failed_preparation_leaves_the_queue_with_its_error_at_no_gpu_cost(harness):
    h = harness(max_skip=3)
    holder = h.submit("holder", "A")
    h.failures["broken"] = LoraNotFoundError("LoRA 'x/y' was not found on the Hub")
    broken = h.submit("broken", "B", ready=False)
    after = h.submit("after", "B")
    assert h.scheduler.waiting == 2
    h.gates["broken"].set()
    with pytest.raises(LoraNotFoundError, match="was not found"):
        asyncio.run(h.scheduler.wait(broken))
    assert h.scheduler.waiting == 1
    h.run_next()
    h.run_next()
    assert h.admitted == [holder, after]
    assert broken.state is TicketState.FAILED


def test_a_cancelled_request_leaves_the_queue_and_releases_its_adapters(harness):
    h = harness(max_skip=3)
    h.submit("holder", "A")
    leaver, stayer = h.submit("leaver", "B"), h.submit("stayer", "B")

    async def wait_then_leave() -> None:
        parked = asyncio.Event()
        waiting = asyncio.create_task(h.scheduler.wait(leaver, lambda view: parked.set()))
        await parked.wait()  # it waits in the queue, told its place
        waiting.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(wait_then_leave())
    assert leaver.state is TicketState.CANCELLED
    with pytest.raises(GenerationCancelledError, match="cancelled while waiting in the queue"):
        asyncio.run(h.scheduler.wait(leaver))
    assert "leaver" in h.released and h.scheduler.waiting == 1
    assert h.scheduler.view(stayer).position == 1
    h.run_next()
    h.run_next()
    assert leaver not in h.admitted


def test_a_full_queue_rejects_at_once_with_a_retry_hint(harness):
    h = harness(max_skip=3, max_queue=3)
    h.submit("holder", "A")
    for i in range(3):
        h.submit(f"q{i}", "A")
    with pytest.raises(EngineBusyError, match=r"busy \(3 requests waiting, limit 3\)") as raised:
        h.submit("one too many", "A")
    assert raised.value.retry_after_s >= 1
    h.run_next()
    h.submit("fits again", "A")


def test_waiting_asynchronously_holds_no_thread_and_a_cancelled_task_leaves(harness):
    h = harness(max_skip=3, max_queue=40)
    holder = h.submit("holder", "A")
    tickets = [h.submit(f"q{i}", "B") for i in range(40)]
    seen: dict[int, list[int]] = {}
    order: list[Ticket] = []

    async def client(ticket: Ticket) -> None:
        await h.scheduler.wait(ticket, lambda view: seen.setdefault(ticket.seq, []).append(view.position))
        order.append(ticket)  # holds the slot: "runs", then leaves it
        await asyncio.sleep(0)
        h.scheduler.finish(ticket)

    async def main() -> None:
        threads_before = threading.active_count()
        tasks = [asyncio.create_task(client(t)) for t in tickets]
        # Every client waits in the queue, told its place.
        await until_async(lambda: len(seen) == len(tickets), "every client told its place", WAIT_S)
        assert threading.active_count() == threads_before
        tasks[5].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[5]
        assert tickets[5].state is TicketState.CANCELLED
        await h.scheduler.wait(holder)
        h.scheduler.finish(holder)
        await asyncio.wait_for(asyncio.gather(*(t for i, t in enumerate(tasks) if i != 5)), WAIT_S)

    asyncio.run(main())
    assert order == [t for i, t in enumerate(tickets) if i != 5]
    # Each waiter was shown its place, and it only went down.
    assert seen[tickets[9].seq][0] == 10
    assert all(a > b for positions in seen.values() for a, b in itertools.pairwise(positions))


def test_the_baseline_mode_prepares_inside_the_slot_in_arrival_order(harness):
    h = harness(max_skip=3, mode="fifo_inline")
    tickets = [h.submit(f"r{i}", "AB"[i % 2]) for i in range(4)]
    for _ in range(4):
        h.run_next()
    assert h.admitted == tickets
    assert all(not h.prepared_in[f"r{i}"].startswith("prepare") for i in range(4))


def test_the_load_gate_bounds_loads_and_bytes_in_flight():
    gate = LoadGate(workers=2, budget=100)
    sizes = [60, 60, 30, 30, 150, 10, 90, 20]
    inside: list[tuple[int, int]] = []
    lock = threading.Lock()

    def load(size: int) -> None:
        with gate.hold(size, f"{size} bytes"):
            with lock:
                inside.append(gate.in_flight)
            time.sleep(0.02)

    threads = [threading.Thread(target=load, args=(s,)) for s in sizes]
    for thread in threads:  # all at once: the gate alone keeps them apart
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(inside) == len(sizes)
    assert gate.peaks[0] <= 2
    # Over the budget only ever by one file that is bigger than the whole budget, loading alone.
    assert all(n <= 100 or (count == 1 and n == 150) for count, n in inside)
    assert gate.in_flight == (0, 0)


def test_the_queue_and_retry_after_count_other_pools_device_time_it_interleaves_with():
    # Issue 48: another pool's video holds the shared device (stand-in: 6 steps of 10 s left); this pool's runs
    # are measured at 2 s (the first guess). A queued run shares the device with the video until it ends: its
    # own 2 s, and up to 2 s of the video's steps interleaved (`DeviceScheduler.ahead_s`).
    clock = Clock()
    device = DeviceScheduler(clock=clock)
    holding, release = threading.Event(), threading.Event()

    def video() -> None:
        with device.turn("wan", 7, video=True) as turn:
            clock.advance(10.0)
            turn.boundary(6)
            holding.set()
            release.wait(WAIT_S)

    thread, errors = started(video)
    assert holding.wait(WAIT_S)
    shared: Scheduler[object] = Scheduler(
        prepare=lambda request: (request, lambda: None),
        identity=lambda prepared: None,
        fused=lambda: None,
        max_queue=1,
        max_skip=0,
        threads=2,
        device_ahead=lambda own: device.ahead_s("sdxl", own),
    )
    try:
        first = shared.submit(GenerateRequest(prompt="first"))
        wait_until(lambda: shared._running is first, "the first request admitted", WAIT_S)
        queued = shared.submit(GenerateRequest(prompt="second"))
        # One run ahead and its own (2 s each), and 4 s of the video's steps interleaved with them.
        assert shared.view(queued).device_s == 8
        with pytest.raises(EngineBusyError) as refused:
            shared.submit(GenerateRequest(prompt="third"))
        assert refused.value.retry_after_s == 8
    finally:
        release.set()
        thread.join(WAIT_S)
        shared.close()
    assert not errors
