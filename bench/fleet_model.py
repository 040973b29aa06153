"""The fleet model's world: costs, the adapter catalogue, replicas with their caches, and one simulated run.

A replica is one GPU running the engine. It holds at most `capacity` prepared adapters (an LRU, like
Ray Serve's per-replica multiplex cache), keeps downloaded files on a disk bounded in bytes (an LRU,
like the Hub cache), prepares one adapter at a time, and runs one image at a time on its GPU. A request
on a replica: wait for a slot, prepare its adapter if it is not held (download it first if it is not
on disk), then on the GPU swap it in if another one is fused, then run inference. Slots bound how many
requests a replica has accepted: the router's `max_ongoing_requests` for Ray Serve; for the others,
one on the GPU plus one preparing ahead (the engine prepares outside its pipeline lock), with a FIFO
queue in front.

The run is simpy's: Poisson arrivals (or closed-loop clients) over Zipf popularity, each request routed
by a policy (bench/fleet_policies.py), its latency from arrival to the end of its inference.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from collections import OrderedDict
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import simpy

__all__ = [
    "Catalogue",
    "Costs",
    "Fleet",
    "Policy",
    "Replica",
    "Request",
    "RunResult",
    "Scenario",
    "percentile",
    "phase_of",
    "request_stream",
    "simulate",
    "simulate_phases",
]

_MB = 1e6


@dataclass(frozen=True)
class Costs:
    """Seconds and bytes per step; every default has a stated source (docs/fleet.md)."""

    # The reference service's figure: one 1024x1024, 25-step SDXL image on an A10G.
    inference_s: float = 8.5
    # bench.swap, rank 32, bf16, 2-core CPU: (c) ours, cached adapter = 383 ms (README), times swap_scale.
    swap_cpu_s: float = 0.383
    # The swap is a memory-bound copy_ + addmm_ over ~1.9 GB of touched bf16 weights: an A10G moves
    # ~600 GB/s against the ~20 GB/s that 383 ms implies on the CPU (30x); 0.1 keeps a 3x margin for
    # the 1,120 kernel launches. Set 1.0 for a GPU figure measured by `bench.swap --device cuda`.
    swap_scale: float = 0.1
    # bench.swap (d) first-seen minus (c) cached, ranks 8/32/128 (23/93/372 MB files): 120/270/678 ms,
    # fitted as 83 ms + 1.6 ms per MB (read header, convert names, match factors, keep in the store).
    prepare_base_s: float = 0.083
    prepare_s_per_mb: float = 0.0016
    # Hub download on a cloud VM; a stated assumption (hf_transfer can do more, a busy Hub less).
    bandwidth_mb_s: float = 100.0
    # SDXL LoRA files span 20-900 MB (rank 4 to 128, with or without text encoders): log-uniform.
    size_min_mb: float = 20.0
    size_max_mb: float = 900.0

    @property
    def swap_s(self) -> float:
        return self.swap_cpu_s * self.swap_scale

    def prepare_s(self, size_mb: float) -> float:
        return self.prepare_base_s + self.prepare_s_per_mb * size_mb

    def download_s(self, size_mb: float) -> float:
        return size_mb / self.bandwidth_mb_s


@dataclass(frozen=True)
class Scenario:
    adapters: int = 2500
    replicas: int = 5
    # Prepared adapters per replica: a little under the engine's 4 GiB host cache over the 231 MB mean file (~18).
    capacity: int = 16
    disk_gb: float = 100.0  # Hub cache per replica; 0 downloads every miss
    zipf: float = 1.1
    warmup: int = 12000  # requests run before measuring: the disks reach their steady state
    requests: int = 9000  # requests measured
    clients: int | None = None  # closed loop with this many clients instead of Poisson arrivals
    # Poisson arrivals after a warm-up sent by this many closed-loop clients (fast, as a real cluster can afford)
    warmup_clients: int | None = None
    costs: Costs = field(default_factory=Costs)

    def __post_init__(self) -> None:
        for name in ("adapters", "replicas", "capacity", "requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is too small; accepted: 1 or more")
        if self.warmup < 0 or self.disk_gb < 0 or self.zipf < 0:
            raise ValueError("warmup, disk_gb and zipf must not be negative")
        if self.clients is not None and self.clients < 1:
            raise ValueError(f"clients={self.clients} is too small; accepted: 1 or more, or None for Poisson")
        if self.warmup_clients is not None and self.warmup_clients < 1:
            raise ValueError(f"warmup_clients={self.warmup_clients} is too small; accepted: 1 or more, or None")

    @property
    def saturation_rate(self) -> float:
        """Requests per second the replicas serve with every GPU busy on inference alone."""
        return self.replicas / self.costs.inference_s


@dataclass(frozen=True)
class Request:
    index: int
    adapter: int
    arrival: float


class Catalogue:
    """Adapter popularity (Zipf over popularity rank = adapter id) and file sizes (log-uniform)."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        weights = [1.0 / (rank + 1) ** scenario.zipf for rank in range(scenario.adapters)]
        total = sum(weights)
        self.share = [w / total for w in weights]
        self._cumulative = list(itertools.accumulate(self.share))
        rng = random.Random(f"sizes-{seed}")
        low, high = math.log(scenario.costs.size_min_mb), math.log(scenario.costs.size_max_mb)
        self.size_mb = [math.exp(rng.uniform(low, high)) for _ in range(scenario.adapters)]

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self._cumulative, rng.random()), len(self.share) - 1)


class Replica:
    """One GPU running the engine: slots, a loader, the GPU, the prepared set and the disk."""

    def __init__(self, fleet: Fleet, index: int, slots: int) -> None:
        self.fleet, self.index = fleet, index
        self.slots = simpy.Resource(fleet.env, capacity=slots)
        self.loader = simpy.Resource(fleet.env, capacity=1)
        self.gpu = simpy.Resource(fleet.env, capacity=1)
        self.prepared: OrderedDict[int, None] = OrderedDict()
        self.loading: set[int] = set()
        self.disk: OrderedDict[int, float] = OrderedDict()
        self.disk_mb = 0.0
        self.fused: int | None = None
        self.pinned: dict[int, int] = {}
        self.ongoing = 0  # accepted and not finished: Ray Serve's queue length
        self.queued: dict[int, int] = {}  # adapters of accepted requests, with counts
        self.backlog_s = 0.0  # expected seconds of accepted work (policies' estimate)
        self.busy_since: float | None = None

    def holds(self, adapter: int) -> bool:
        """Loaded or loading: what a replica reports to Ray Serve's router as its multiplexed ids."""
        return adapter in self.prepared or adapter in self.loading

    def model_count(self) -> int:
        return len(self.prepared) + len(self.loading)

    def expected_service_s(self, adapter: int) -> float:
        """What the router expects one more request for `adapter` to cost here, queue excluded."""
        costs = self.fleet.scenario.costs
        load = 0.0
        if not self.holds(adapter) and adapter not in self.queued:
            size = self.fleet.catalogue.size_mb[adapter]
            load = costs.prepare_s(size) + (0.0 if adapter in self.disk else costs.download_s(size))
        swap = 0.0 if self.fused == adapter and self.ongoing == 0 else costs.swap_s
        return load + swap + costs.inference_s

    def remaining_s(self) -> float:
        """Expected seconds until the work accepted so far is done."""
        elapsed = 0.0 if self.busy_since is None else self.fleet.env.now - self.busy_since
        return max(0.0, self.backlog_s - elapsed)

    def accept(self, request: Request) -> None:
        """Take the request now (the router counts it at once) and serve it in its own process."""
        expected = self.expected_service_s(request.adapter)
        self.ongoing += 1
        self.queued[request.adapter] = self.queued.get(request.adapter, 0) + 1
        self.backlog_s += expected
        self.fleet.env.process(self._serve(request, expected))

    def _serve(self, request: Request, expected: float) -> Generator[simpy.Event, object, None]:
        env, costs, adapter = self.fleet.env, self.fleet.scenario.costs, request.adapter
        with self.slots.request() as slot:
            yield slot
            with self.loader.request() as loading:
                yield loading
                hit = adapter in self.prepared
                downloaded = False
                if hit:
                    self.prepared.move_to_end(adapter)
                else:
                    downloaded = yield from self._load(adapter)
                self.pinned[adapter] = self.pinned.get(adapter, 0) + 1
            with self.gpu.request() as gpu:
                yield gpu
                self.busy_since = env.now
                swapped = self.fused != adapter
                if swapped:
                    yield env.timeout(costs.swap_s)
                    self.fused = adapter
                yield env.timeout(costs.inference_s)
        self.busy_since = None
        self.backlog_s -= expected
        self.pinned[adapter] -= 1
        if not self.pinned[adapter]:
            del self.pinned[adapter]
        self.queued[adapter] -= 1
        if not self.queued[adapter]:
            del self.queued[adapter]
        self.ongoing -= 1
        self.fleet.finish(request, hit=hit, swapped=swapped, downloaded=downloaded)

    def _load(self, adapter: int) -> Generator[simpy.Event, object, bool]:
        """Prepare `adapter` (downloading it first when it is not on disk); True when it was downloaded."""
        env, costs = self.fleet.env, self.fleet.scenario.costs
        size = self.fleet.catalogue.size_mb[adapter]
        self.loading.add(adapter)
        downloaded = adapter not in self.disk
        if not downloaded:
            self.disk.move_to_end(adapter)
        else:
            yield env.timeout(costs.download_s(size))
            self._keep_on_disk(adapter, size)
        yield env.timeout(costs.prepare_s(size))
        self.loading.discard(adapter)
        self.prepared[adapter] = None
        # Evict the least recently used adapter no request here still needs.
        for victim in list(self.prepared):
            if len(self.prepared) <= self.fleet.scenario.capacity:
                break
            if victim not in self.pinned and victim != adapter:
                del self.prepared[victim]
        return downloaded

    def _keep_on_disk(self, adapter: int, size: float) -> None:
        budget = self.fleet.scenario.disk_gb * 1e9 / _MB
        if size > budget:
            return
        self.disk[adapter] = size
        self.disk_mb += size
        while self.disk_mb > budget:
            _, freed = self.disk.popitem(last=False)
            self.disk_mb -= freed


class Policy(Protocol):
    """A routing policy: how many slots its replicas have, and where each request goes."""

    name: str

    @property
    def replica_slots(self) -> int: ...

    def route(self, fleet: Fleet, request: Request) -> Generator[simpy.Event, object, None]:
        """Ends by calling `accept` on one replica; may wait (yield simpy events) before that."""
        ...


@dataclass(frozen=True)
class RunResult:
    policy: str
    rate: float  # offered requests per second (for closed loop: measured throughput)
    completed: int
    hit_rate: float  # requests whose adapter was prepared on their replica when they got there
    swaps_per_request: float
    swaps_per_s: float
    p50_s: float
    p95_s: float
    mean_s: float
    downloads_per_s: float


class Fleet:
    """One run's world: the simpy environment, the replicas and what was measured."""

    def __init__(self, scenario: Scenario, policy: Policy, seed: int) -> None:
        self.scenario, self.policy = scenario, policy
        self.env = simpy.Environment()
        self.catalogue = Catalogue(scenario, seed)
        self.rng = random.Random(f"policy-{seed}")  # the policy's own draws
        self.replicas = [Replica(self, i, policy.replica_slots) for i in range(scenario.replicas)]
        # Each measured request: its index, latency, hit, swapped, downloaded, completion time.
        self._done: list[tuple[int, float, bool, bool, bool, float]] = []
        self._done_clients: dict[int, simpy.Event] = {}

    def finish(self, request: Request, *, hit: bool, swapped: bool, downloaded: bool) -> None:
        if request.index >= self.scenario.warmup:
            latency = self.env.now - request.arrival
            self._done.append((request.index, latency, hit, swapped, downloaded, self.env.now))
        done = self._done_clients.pop(request.index, None)
        if done is not None:
            done.succeed()

    def _phase(self, index: int, phases: int) -> int:
        return phase_of(index, self.scenario, phases)

    def _poisson(self, rates: Sequence[float], adapters: Sequence[int], gaps: Sequence[float]) -> Generator:
        for index, (adapter, gap) in enumerate(zip(adapters, gaps, strict=True)):
            yield self.env.timeout(gap / rates[self._phase(index, len(rates))])
            self.env.process(self.policy.route(self, Request(index, adapter, self.env.now)))

    def _warm_then_poisson(self, rates: Sequence[float], adapters: Sequence[int], gaps: Sequence[float]) -> Generator:
        """The warm-up from closed-loop clients, then the measured requests at their phase's rate once it is over."""
        warmup, clients = self.scenario.warmup, self.scenario.warmup_clients or 1
        yield self.env.all_of(
            [self.env.process(self._client(range(c, warmup, clients), adapters)) for c in range(clients)]
        )
        for index in range(warmup, len(adapters)):
            yield self.env.timeout(gaps[index] / rates[self._phase(index, len(rates))])
            self.env.process(self.policy.route(self, Request(index, adapters[index], self.env.now)))

    def _client(self, indices: Sequence[int], adapters: Sequence[int]) -> Generator:
        for index in indices:
            done = self.env.event()
            self._done_clients[index] = done
            self.env.process(self.policy.route(self, Request(index, adapters[index], self.env.now)))
            yield done

    def run(self, rates: Sequence[float], seed: int) -> list[RunResult]:
        """One result per rate: the measured requests split evenly between the rates, in order (one for closed loop)."""
        total = self.scenario.warmup + self.scenario.requests
        adapters, gaps = request_stream(self.scenario, seed)
        clients = self.scenario.clients
        if clients is None and self.scenario.warmup_clients is not None:
            self.env.process(self._warm_then_poisson(rates, adapters, gaps))
        elif clients is None:
            self.env.process(self._poisson(rates, adapters, gaps))
        else:
            for client in range(clients):
                self.env.process(self._client(range(client, total, clients), adapters))
        self.env.run()
        phases = [[d for d in self._done if self._phase(d[0], len(rates)) == p] for p in range(len(rates))]
        return [self._result(rate if clients is None else None, done) for rate, done in zip(rates, phases, strict=True)]

    def _result(self, rate: float | None, done: Sequence[tuple[int, float, bool, bool, bool, float]]) -> RunResult:
        measured = len(done)
        ends = [d[5] for d in done]
        span = max(ends) - min(ends) if measured > 1 else 0.0
        latencies = sorted(d[1] for d in done)
        swaps = sum(d[3] for d in done)
        return RunResult(
            policy=self.policy.name,
            rate=rate if rate is not None else (measured / span if span else 0.0),
            completed=measured,
            hit_rate=sum(d[2] for d in done) / measured,
            swaps_per_request=swaps / measured,
            swaps_per_s=swaps / span if span else 0.0,
            p50_s=percentile(latencies, 50),
            p95_s=percentile(latencies, 95),
            mean_s=statistics.fmean(latencies),
            downloads_per_s=sum(d[4] for d in done) / span if span else 0.0,
        )


def request_stream(scenario: Scenario, seed: int) -> tuple[list[int], list[float]]:
    """Each request's adapter, and its gap before it in units of 1/rate (warm-up requests first).

    Common random numbers: the same adapters and gaps at every rate and for every policy, so their
    results differ by the policy and the rate alone. A real cluster can replay the same sequence.
    """
    total = scenario.warmup + scenario.requests
    catalogue = Catalogue(scenario, seed)
    draws = random.Random(f"arrivals-{seed}")
    adapters = [catalogue.draw(draws) for _ in range(total)]
    return adapters, [draws.expovariate(1.0) for _ in range(total)]


def phase_of(index: int, scenario: Scenario, phases: int) -> int:
    """Request `index`'s phase: the measured requests split evenly into `phases`, in order; the warm-up is the
    first phase's."""
    return max(0, index - scenario.warmup) * phases // scenario.requests


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile of an ascending sequence."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def simulate(scenario: Scenario, policy: Policy, rate: float, seed: int = 0) -> RunResult:
    """One run: `scenario` under `policy` at `rate` requests per second (ignored for closed loop)."""
    return simulate_phases(scenario, policy, [rate], seed)[0]


def simulate_phases(scenario: Scenario, policy: Policy, rates: Sequence[float], seed: int = 0) -> list[RunResult]:
    """One run whose measured requests come at each rate in turn, evenly split, after one warm-up; a result per
    rate. What a cluster measures without redeploying between rates: each phase starts where the last one left
    the caches and disks."""
    if scenario.clients is None and (not rates or min(rates) <= 0):
        raise ValueError(f"rates={list(rates)} are not all positive; accepted: requests per second > 0")
    if scenario.clients is not None and len(rates) != 1:
        raise ValueError(f"a closed loop has one phase, not {len(rates)}; accepted: one rate (ignored)")
    if scenario.requests < len(rates):
        raise ValueError(f"{scenario.requests} requests cannot fill {len(rates)} phases; accepted: one or more each")
    return Fleet(scenario, policy, seed).run(rates, seed)
