"""Routing policies for the fleet model: Ray Serve's router with and without a multiplexed id, and two of ours.

Each policy's `route` is a simpy process that ends by handing the request to one replica. A policy
object keeps state for one run (make_policy makes a fresh one).
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import simpy

from .fleet_model import Fleet, Replica, Request

__all__ = ["POLICIES", "AffinitySpread", "LeastFinish", "RayMultiplexed", "RoutingContext", "make_policy"]

# One on the GPU plus one preparing ahead: the engine prepares outside its pipeline lock.
_PREPARE_AHEAD_SLOTS = 2


@dataclass
class RoutingContext:
    """Ray's `RequestRoutingContext` fields that the multiplex routing reads and sets."""

    started: float | None = None
    tried_first: bool = False
    tried_fewest: bool = False


class RayMultiplexed:
    """Ray Serve 2.60.0's PowerOfTwoChoicesRequestRouter with a multiplexed model id, as its code does it.

    ray/serve/_private/request_router/request_router.py, `MultiplexMixin.apply_multiplex_routing`:
    while the request has routed for less than a matching timeout drawn from U(1 s, 2 s) on every call
    (`_multiplexed_matching_timeout`, RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S = 1.0), the
    first try goes to the replicas holding the id (loaded or loading, as `_ModelMultiplexWrapper`
    reports them), else, once per id among concurrent requests (`_multiplexed_model_id_fallback_match`),
    to those with the fewest models (`_get_replica_ids_with_fewest_multiplexed_models`); every later try
    goes to the fewest-models set. Past the timeout: the fewest-models set once, then every replica.
    pow_2_router.py, `PowerOfTwoChoicesRequestRouter.choose_replicas`: two distinct replicas drawn from
    the candidates; request_router.py, `_select_from_candidate_replicas`: of those whose queue length is
    below `max_ongoing_requests`, the shortest; none -> `_choose_replicas_with_backoff` retries at once,
    then sleeps 25 ms doubling to 500 ms (RAY_SERVE_ROUTER_RETRY_*). Requests are taken in FIFO order
    by at most 2 x replicas routing tasks (`max_num_routing_tasks`).

    With `multiplexed=False` it is the same router for requests without a model id: the baseline
    `random`, blind to adapters (a random replica with a free slot, late-bound like Ray's).

    Simplified: the router's queue-length cache and the replicas' multiplexed ids are exact and current
    here (Ray refreshes ids every 0.1 s, PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S, far below 8.5 s of inference).
    """

    matching_timeout_s = 1.0
    initial_backoff_s = 0.025
    max_backoff_s = 0.5

    def __init__(self, max_ongoing_requests: int = 1, *, multiplexed: bool = True) -> None:
        if max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests={max_ongoing_requests}; accepted: 1 or more")
        self.max_ongoing = max_ongoing_requests
        self.multiplexed = multiplexed
        self.name = f"ray_multiplexed_m{max_ongoing_requests}" if multiplexed else f"random_m{max_ongoing_requests}"
        self._fallback: set[int] = set()
        self._tasks: simpy.Resource | None = None

    @property
    def replica_slots(self) -> int:
        return self.max_ongoing

    def route(self, fleet: Fleet, request: Request) -> Generator[simpy.Event, object, None]:
        if self._tasks is None:
            self._tasks = simpy.Resource(fleet.env, capacity=2 * len(fleet.replicas))
        with self._tasks.request() as task:
            yield task
            context = RoutingContext(started=fleet.env.now)
            attempt, entered_backoff = 0, False
            while True:
                candidates = self._candidates(fleet, request.adapter, context)
                if candidates:
                    chosen = self._select(self._two_choices(fleet.rng, candidates))
                    if chosen is not None:
                        chosen.accept(request)
                        return
                if not entered_backoff:
                    entered_backoff = True  # Ray retries once at once, then backs off
                else:
                    # Ray catches the OverflowError of a long wait and takes the ceiling; so does the cap.
                    yield fleet.env.timeout(min(self.initial_backoff_s * 2 ** min(attempt, 32), self.max_backoff_s))
                    attempt += 1

    def _candidates(self, fleet: Fleet, adapter: int, context: RoutingContext) -> list[Replica]:
        if not self.multiplexed:  # no model id: `apply_locality_routing`, every replica on one node
            context.tried_first = True
            return list(fleet.replicas)
        elapsed = fleet.env.now - (context.started or 0.0)
        timeout = fleet.rng.uniform(self.matching_timeout_s, 2 * self.matching_timeout_s)
        if elapsed < timeout:
            holders = [r for r in fleet.replicas if r.holds(adapter)]
            if (not holders and adapter not in self._fallback) or context.tried_first:
                candidates = _fewest_models(fleet.replicas)
                self._fallback.add(adapter)
            else:
                candidates = holders  # empty when another request already fell back for this id
                if holders:
                    self._fallback.discard(adapter)
            context.tried_first = True
            return candidates
        if not context.tried_fewest:
            context.tried_fewest = True
            return _fewest_models(fleet.replicas)
        return list(fleet.replicas)

    @staticmethod
    def _two_choices(rng: random.Random, candidates: Sequence[Replica]) -> list[Replica]:
        n = len(candidates)
        if n == 1:
            return [candidates[0]]
        if n == 2:
            return list(candidates) if rng.getrandbits(1) else [candidates[1], candidates[0]]
        i = rng.randrange(n)
        j = rng.randrange(n - 1)
        return [candidates[i], candidates[j + 1 if j >= i else j]]

    def _select(self, chosen: Sequence[Replica]) -> Replica | None:
        best: Replica | None = None
        for replica in chosen:
            if replica.ongoing < self.max_ongoing and (best is None or replica.ongoing < best.ongoing):
                best = replica
        return best


def _fewest_models(replicas: Sequence[Replica]) -> list[Replica]:
    fewest = min(r.model_count() for r in replicas)
    return [r for r in replicas if r.model_count() == fewest]


def _home_order(fleet: Fleet, adapter: int) -> list[Replica]:
    """Rendezvous hashing: each adapter's fixed order of preference over the replicas."""
    scores = random.Random(f"home-{adapter}")
    return sorted(fleet.replicas, key=lambda r: (scores.random(), r.index))


class AffinitySpread:
    """Ours: each adapter has home replicas (rendezvous hashing); hot adapters get several homes.

    An adapter's share of the last `window` requests sets its number of homes, ceil(share x replicas x
    `spread`), at least 1: one that takes a fifth of the traffic of five replicas gets two homes. The
    request goes to the home with the shortest queue; when that queue holds `bound` requests or more,
    to the replica with the shortest queue instead, holders first. A bound of 1 (only an idle home)
    is the default: waiting behind one 8.5 s image costs more than preparing the adapter elsewhere.
    """

    name = "affinity_spread"
    replica_slots = _PREPARE_AHEAD_SLOTS

    def __init__(self, window: int = 2000, spread: float = 1.5, bound: int = 1) -> None:
        self.window, self.spread, self.bound = window, spread, bound
        self._recent: deque[int] = deque()
        self._counts: Counter[int] = Counter()
        self._homes: dict[int, list[Replica]] = {}

    def _observe(self, adapter: int) -> float:
        self._recent.append(adapter)
        self._counts[adapter] += 1
        if len(self._recent) > self.window:
            self._counts[self._recent.popleft()] -= 1
        return self._counts[adapter] / len(self._recent)

    def route(self, fleet: Fleet, request: Request) -> Generator[simpy.Event, object, None]:
        share = self._observe(request.adapter)
        homes = self._homes.get(request.adapter)
        if homes is None:
            homes = self._homes[request.adapter] = _home_order(fleet, request.adapter)
        count = min(len(homes), max(1, math.ceil(share * len(homes) * self.spread)))
        home = min(homes[:count], key=lambda r: r.ongoing)
        if home.ongoing < self.bound:
            home.accept(request)
        else:
            best = min(fleet.replicas, key=lambda r: (r.ongoing, not r.holds(request.adapter), homes.index(r)))
            best.accept(request)
        yield from ()


class LeastFinish:
    """Ours: the replica where the request is expected to finish first, counting what it must load.

    Expected finish = the accepted work still to do in the request's pool there + downloading (when not
    on disk) and preparing (when not held or queued) + swapping + inference, + the other pool's run in its
    way on the shared GPU as the engine counts it (`Replica.finish_s`: a video's pieces interleave with
    an image, so at most the image's own time of them). Ties go to the adapter's home order,
    so an adapter sticks to one replica until queueing there costs more than loading it elsewhere.
    """

    name = "least_finish"
    replica_slots = _PREPARE_AHEAD_SLOTS

    def __init__(self) -> None:
        self._homes: dict[int, list[Replica]] = {}

    def route(self, fleet: Fleet, request: Request) -> Generator[simpy.Event, object, None]:
        homes = self._homes.get(request.adapter)
        if homes is None:
            homes = self._homes[request.adapter] = _home_order(fleet, request.adapter)
        best = min(homes, key=lambda r: r.finish_s(request.adapter, request.video))
        best.accept(request)
        yield from ()


POLICIES = ("random", "ray_multiplexed_m1", "ray_multiplexed_m2", "affinity_spread", "least_finish")


def make_policy(name: str) -> RayMultiplexed | AffinitySpread | LeastFinish:
    """A fresh policy by name (policies keep per-run state, so each run gets its own)."""
    if name == "random":
        policy = RayMultiplexed(1, multiplexed=False)
        policy.name = "random"
        return policy
    if name.startswith("ray_multiplexed_m") and name.removeprefix("ray_multiplexed_m").isdigit():
        return RayMultiplexed(int(name.removeprefix("ray_multiplexed_m")))
    if name == "affinity_spread":
        return AffinitySpread()
    if name == "least_finish":
        return LeastFinish()
    raise ValueError(f"unknown policy {name!r}; accepted: {', '.join(POLICIES)} (ray_multiplexed_m<N> for any N)")
