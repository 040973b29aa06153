"""The fleet model's world: costs, the adapter catalogue, replicas with their caches, and one simulated run.

A replica is one GPU running the engine. It holds at most `capacity` prepared adapters (an LRU, like
Ray Serve's per-replica multiplex cache), keeps downloaded files on a disk bounded in bytes (an LRU,
like the Hub cache), prepares one adapter at a time, and runs one image at a time on its GPU. A request
on a replica: wait for a slot, prepare its adapter if it is not held (download it first if it is not
on disk), then in its pool (one run at a time; an image pool and, with videos, a video pool, each with its
fused adapter) swap it in if another one is fused, then run inference on the replica's GPU, shared by its pools
as the engine shares it (bench/fleet_device.py: step by step by default). Slots bound how many
requests a replica has accepted: the router's `max_ongoing_requests` for Ray Serve; for the others,
one on the GPU plus one preparing ahead (the engine prepares outside its pipeline lock), with a FIFO
queue in front.

The run is simpy's: Poisson arrivals (or closed-loop clients) over Zipf popularity, each request routed
by a policy (bench/fleet_policies.py), its latency from arrival to the end of its inference. With
`video_share`, that share of the requests (drawn per request from a stream of their own: the adapters and gaps
stay those of the images-only run) are videos of the same catalogue's adapters, each its pool's run of Wan's
steps and decode pieces (`bench.mixed`'s stand-in A10G table, its sources there).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import OrderedDict
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Protocol

import simpy
import torch

from bench.fleet_device import SimDevice
from bench.fleet_scenario import Catalogue, Costs, Request, Scenario
from engine.pipeline.sharing import sharing_mode

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
    "request_kinds",
    "request_stream",
    "simulate",
    "simulate_phases",
]

_MB = 1e6
_Done = tuple[int, float, bool, bool, bool, float, bool]
_POOL = ("image", "video")  # each pool's name on the device


class Replica:
    """One GPU running the engine: slots, a loader, the GPU, the prepared set and the disk."""

    def __init__(self, fleet: Fleet, index: int, slots: int) -> None:
        self.fleet, self.index = fleet, index
        # Each pool's (image, video): the engine queues per pool, so a waiting video takes no image's slot.
        self.slots = tuple(simpy.Resource(fleet.env, capacity=slots) for _ in range(2))
        self.loader = simpy.Resource(fleet.env, capacity=1)
        self.pools = (simpy.Resource(fleet.env, capacity=1), simpy.Resource(fleet.env, capacity=1))  # image, video
        scenario = fleet.scenario
        sharing = sharing_mode(scenario.device_sharing, torch.device("cuda"), per_call=False)
        self.device = SimDevice(fleet.env, sharing, scenario.starve_steps)
        self.prepared: OrderedDict[int, None] = OrderedDict()
        self.loading: set[int] = set()
        self.disk: OrderedDict[int, float] = OrderedDict()
        self.disk_mb = 0.0
        self.fused: list[int | None] = [None, None]  # each pool's
        self.pinned: dict[int, int] = {}
        self.ongoing = 0  # accepted and not finished: Ray Serve's queue length
        self.queued: dict[int, int] = {}  # adapters of accepted requests, with counts
        # Each pool's (image, video) expected seconds of accepted work (policies' estimate), and since when its
        # current run has run: the engine queues per pool, and the other pool's run is on the device (`finish_s`).
        self.backlog_s = [0.0, 0.0]
        self.busy_since: list[float | None] = [None, None]

    def holds(self, adapter: int) -> bool:
        """Loaded or loading: what a replica reports to Ray Serve's router as its multiplexed ids."""
        return adapter in self.prepared or adapter in self.loading

    def model_count(self) -> int:
        return len(self.prepared) + len(self.loading)

    def expected_service_s(self, adapter: int, video: bool = False) -> float:
        """What the router expects one more request for `adapter` to cost here, queue excluded."""
        costs = self.fleet.scenario.costs
        load = 0.0
        if not self.holds(adapter) and adapter not in self.queued:
            size = self.fleet.catalogue.size_mb[adapter]
            load = costs.prepare_s(size) + (0.0 if adapter in self.disk else costs.download_s(size))
        swap = 0.0 if self.fused[video] == adapter and self.ongoing == 0 else costs.swap_s
        return load + swap + sum(costs.pieces(video, split=False))

    def remaining_s(self, video: bool = False) -> float:
        """Expected seconds until the work its pool (image or video) has accepted so far is done."""
        since = self.busy_since[video]
        elapsed = 0.0 if since is None else self.fleet.env.now - since
        return max(0.0, self.backlog_s[video] - elapsed)

    def finish_s(self, adapter: int, video: bool = False) -> float:
        """When one more request would finish here: its pool's work and its own, and the other pool's run on the
        device in its way as the engine counts it (all of a shorter one, at most as long as its own of a longer one
        whose pieces interleave: `SimDevice.ahead_s`)."""
        own = self.remaining_s(video) + self.expected_service_s(adapter, video)
        return own + self.device.ahead_s(_POOL[video], own)

    def accept(self, request: Request) -> None:
        """Take the request now (the router counts it at once) and serve it in its own process."""
        expected = self.expected_service_s(request.adapter, request.video)
        self.ongoing += 1
        self.queued[request.adapter] = self.queued.get(request.adapter, 0) + 1
        self.backlog_s[request.video] += expected
        self.fleet.env.process(self._serve(request, expected))

    def _serve(self, request: Request, expected: float) -> Generator[simpy.Event, object, None]:
        env, costs, adapter, video = self.fleet.env, self.fleet.scenario.costs, request.adapter, request.video
        with self.slots[video].request() as slot:
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
            with self.pools[video].request() as pool:
                yield pool
                self.busy_since[video] = env.now
                swapped = self.fused[video] != adapter
                if swapped:  # the engine swaps under its pool's lock, outside its turn on the device
                    yield env.timeout(costs.swap_s)
                    self.fused[video] = adapter
                # Images alone never share the device: one piece is the same run, in far fewer events.
                split = self.fleet.scenario.video_share > 0
                pieces, chunks = costs.pieces(video, split), costs.chunks(video, split)
                step_pieces = costs.video_step_pieces if video else 1
                yield from self.device.run(_POOL[video], pieces, video=video, step_pieces=step_pieces, chunks=chunks)
        self.busy_since[video] = None
        self.backlog_s[video] -= expected
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
    # By kind, with videos in the traffic (NaN for a kind with no request).
    image_p95_s: float = math.nan
    video_p95_s: float = math.nan

    @property
    def target_p95_s(self) -> float:
        """The p95 a latency target holds: the images' beside videos (a video takes minutes whatever the router
        does), else every request's."""
        return self.p95_s if math.isnan(self.image_p95_s) or math.isnan(self.video_p95_s) else self.image_p95_s


class Fleet:
    """One run's world: the simpy environment, the replicas and what was measured."""

    def __init__(self, scenario: Scenario, policy: Policy, seed: int) -> None:
        self.scenario, self.policy = scenario, policy
        self.env = simpy.Environment()
        self.catalogue = Catalogue(scenario, seed)
        self.rng = random.Random(f"policy-{seed}")  # the policy's own draws
        self.replicas = [Replica(self, i, policy.replica_slots) for i in range(scenario.replicas)]
        # Each measured request: its index, latency, hit, swapped, downloaded, completion time, video.
        self._done: list[_Done] = []
        self._videos: list[bool] = []
        self._done_clients: dict[int, simpy.Event] = {}

    def finish(self, request: Request, *, hit: bool, swapped: bool, downloaded: bool) -> None:
        if request.index >= self.scenario.warmup:
            latency = self.env.now - request.arrival
            self._done.append((request.index, latency, hit, swapped, downloaded, self.env.now, request.video))
        done = self._done_clients.pop(request.index, None)
        if done is not None:
            done.succeed()

    def _phase(self, index: int, phases: int) -> int:
        return phase_of(index, self.scenario, phases)

    def _poisson(self, rates: Sequence[float], adapters: Sequence[int], gaps: Sequence[float]) -> Generator:
        for index, (adapter, gap) in enumerate(zip(adapters, gaps, strict=True)):
            yield self.env.timeout(gap / rates[self._phase(index, len(rates))])
            self._send(index, adapter)

    def _warm_then_poisson(self, rates: Sequence[float], adapters: Sequence[int], gaps: Sequence[float]) -> Generator:
        """The warm-up from closed-loop clients, then the measured requests at their phase's rate once it is over."""
        warmup, clients = self.scenario.warmup, self.scenario.warmup_clients or 1
        yield self.env.all_of(
            [self.env.process(self._client(range(c, warmup, clients), adapters)) for c in range(clients)]
        )
        for index in range(warmup, len(adapters)):
            yield self.env.timeout(gaps[index] / rates[self._phase(index, len(rates))])
            self._send(index, adapters[index])

    def _client(self, indices: Sequence[int], adapters: Sequence[int]) -> Generator:
        for index in indices:
            done = self.env.event()
            self._done_clients[index] = done
            self._send(index, adapters[index])
            yield done

    def _send(self, index: int, adapter: int) -> None:
        request = Request(index, adapter, self.env.now, self._videos[index])
        self.env.process(self.policy.route(self, request))

    def run(self, rates: Sequence[float], seed: int) -> list[RunResult]:
        """One result per rate: the measured requests split evenly between the rates, in order (one for closed loop)."""
        total = self.scenario.warmup + self.scenario.requests
        adapters, gaps = request_stream(self.scenario, seed)
        self._videos = request_kinds(self.scenario, seed, len(adapters))
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

    def _result(self, rate: float | None, done: Sequence[_Done]) -> RunResult:
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
            image_p95_s=_p95_or_nan([d[1] for d in done if not d[6]]),
            video_p95_s=_p95_or_nan([d[1] for d in done if d[6]]),
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


def request_kinds(scenario: Scenario, seed: int, count: int) -> list[bool]:
    """Whether each of `count` requests is a video (`video_share` of them, drawn from a stream of their own, so the
    adapters and gaps stay those of the images-only run); a real cluster can replay the same."""
    kinds = random.Random(f"kinds-{seed}")
    return [kinds.random() < scenario.video_share for _ in range(count)]


def phase_of(index: int, scenario: Scenario, phases: int) -> int:
    """Request `index`'s phase: the measured requests split evenly into `phases`, in order; the warm-up is the
    first phase's."""
    return max(0, index - scenario.warmup) * phases // scenario.requests


def _p95_or_nan(latencies: list[float]) -> float:
    return percentile(sorted(latencies), 95) if latencies else math.nan


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
