"""Our router's policy for a pool's replicas: `least_finish` of the fleet model (bench/fleet_policies.py).

A request goes to the replica where it is expected to finish first (queue + load + swap + inference, each from
our ledger or the replicas' measured costs); ties go to the set's rendezvous-hash order, so a set sticks to one
replica; replicas whose stats went stale come last. No ray here: the unit tests and `serving.cluster.router`
share it. Each term of the estimate: docs/internals.md, "serving/cluster/policy.py".
"""

from __future__ import annotations

import hashlib
import statistics
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from serving.cluster.stats import ReplicaStats, SetCost

__all__ = ["Choice", "Costs", "Ledger", "ReplicaView", "home_order", "pool_costs", "rank", "service_s", "set_cost"]


@dataclass(frozen=True)
class Costs:
    """Seconds a request costs a replica by step: the pool's means, or the router's defaults before any report."""

    inference_s: float
    swap_s: float
    prepare_s: float
    download_s: float

    def __post_init__(self) -> None:
        for name in ("inference_s", "swap_s", "prepare_s", "download_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is not a duration; accepted: seconds >= 0")


@dataclass(frozen=True)
class ReplicaView:
    """One replica as the router sees it now: its last report (None: none yet or unreadable), the ids Serve
    reports it holds (multiplexed ids: prepared or loading), and whether its report went stale."""

    id: str
    stats: ReplicaStats | None = None
    serve_ids: frozenset[str] = frozenset()
    stale: bool = False

    def holds(self, set_id: str) -> bool:
        """Prepared or loading, as the replica or Serve last said."""
        if set_id in self.serve_ids:
            return True
        return self.stats is not None and (set_id in self.stats.prepared or set_id in self.stats.loading)

    def on_disk(self, set_id: str) -> SetCost | None:
        return None if self.stats is None else self.stats.disk.get(set_id)


@dataclass
class _Sent:
    replica: str
    set_id: str
    expected_s: float
    at: float
    confirmed: bool = False


@dataclass
class Ledger:
    """The requests this router sent to each replica and not yet finished, with what each was expected to cost.

    A choice is written at once (`send`), so concurrent choices see it; Serve then says where the request
    went (`confirm`) and when it ended (`done`). A choice never confirmed (the caller went away while it
    was routed) is forgotten after `unconfirmed_ttl_s`.
    """

    unconfirmed_ttl_s: float = 30.0
    _sent: dict[str, _Sent] = field(default_factory=dict)
    _head_since: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, request_id: str, replica: str, set_id: str, expected_s: float, now: float) -> None:
        with self._lock:
            self._remove(request_id, now)
            if not any(s.replica == replica for s in self._sent.values()):
                self._head_since[replica] = now
            self._sent[request_id] = _Sent(replica, set_id, expected_s, now)

    def confirm(self, request_id: str, replica: str, expected_s: float, now: float) -> None:
        """Serve sent the request to `replica` (maybe not the first choice) and the replica accepted it."""
        with self._lock:
            sent = self._sent.get(request_id)
            set_id = "" if sent is None else sent.set_id
            if sent is None or sent.replica != replica:
                self._remove(request_id, now)
                if not any(s.replica == replica for s in self._sent.values()):
                    self._head_since[replica] = now
                sent = self._sent[request_id] = _Sent(replica, set_id, expected_s, now)
            sent.confirmed = True

    def done(self, request_id: str, now: float) -> None:
        with self._lock:
            self._remove(request_id, now)

    def forget_replica(self, replica: str) -> None:
        with self._lock:
            for request_id in [r for r, s in self._sent.items() if s.replica == replica]:
                del self._sent[request_id]
            self._head_since.pop(replica, None)

    def remaining_s(self, replica: str, now: float) -> float:
        """Expected seconds until the work sent to `replica` is done (the sim's `Replica.remaining_s`)."""
        with self._lock:
            self._expire(now)
            backlog = sum(s.expected_s for s in self._sent.values() if s.replica == replica)
            if not backlog:
                return 0.0
            return max(0.0, backlog - (now - self._head_since.get(replica, now)))

    def queued(self, replica: str) -> tuple[int, frozenset[str]]:
        """How many requests `replica` has from this router, and their sets."""
        with self._lock:
            sets = [s.set_id for s in self._sent.values() if s.replica == replica]
        return len(sets), frozenset(sets)

    def _remove(self, request_id: str, now: float) -> None:
        sent = self._sent.pop(request_id, None)
        if sent is not None and any(s.replica == sent.replica for s in self._sent.values()):
            # The next request there starts now: its expected cost counts from here.
            self._head_since[sent.replica] = now

    def _expire(self, now: float) -> None:
        old = [r for r, s in self._sent.items() if not s.confirmed and now - s.at > self.unconfirmed_ttl_s]
        for request_id in old:
            self._remove(request_id, now)


def pool_costs(views: Iterable[ReplicaView], defaults: Costs) -> Costs:
    """The pool's mean measured costs over fresh reports; a default where nobody measured it yet."""
    reports = [v.stats.measured for v in views if v.stats is not None and not v.stale]

    def mean(name: str) -> float:
        values = [value for m in reports if (value := getattr(m, name)) is not None]
        return statistics.fmean(values) if values else getattr(defaults, name)

    return Costs(mean("inference_s"), mean("swap_s"), mean("prepare_s"), mean("download_s"))


def set_cost(views: Iterable[ReplicaView], set_id: str, costs: Costs) -> SetCost:
    """What loading `set_id` costs where its files are not: as measured by a replica that loaded it, else means."""
    for view in views:
        known = view.on_disk(set_id)
        if known is not None:
            return known
    return SetCost(download_s=costs.download_s, prepare_s=costs.prepare_s)


def service_s(view: ReplicaView, set_id: str, queued: tuple[int, frozenset[str]], costs: Costs, cost: SetCost) -> float:
    """What one more request for `set_id` is expected to cost `view`, its queue excluded (the sim's
    `Replica.expected_service_s`); `queued` is `Ledger.queued` for it, `cost` is `set_cost`."""
    count, sets = queued
    load = 0.0
    if set_id and not view.holds(set_id) and set_id not in sets:
        here = view.on_disk(set_id)
        load = here.prepare_s if here is not None else cost.prepare_s + cost.download_s
    fused = view.stats is not None and view.stats.fused == set_id
    swap = 0.0 if fused and count == 0 else costs.swap_s
    return load + swap + costs.inference_s


def home_order(set_id: str, replicas: Sequence[str]) -> list[str]:
    """Rendezvous hashing: the set's fixed order of preference over the replicas (any replica set)."""
    return sorted(replicas, key=lambda r: (hashlib.blake2b(f"{set_id}\0{r}".encode(), digest_size=8).digest(), r))


@dataclass(frozen=True)
class Choice:
    """A replica for one request: when the request would finish there, and what it would add to its queue."""

    replica: str
    finish_s: float
    service_s: float


def rank(views: Sequence[ReplicaView], set_id: str, ledger: Ledger, defaults: Costs, now: float) -> list[Choice]:
    """Every replica for a request for `set_id`, best first: the policy of this module's docstring."""
    costs = pool_costs(views, defaults)
    cost = set_cost(views, set_id, costs)
    home = {replica: i for i, replica in enumerate(home_order(set_id, [v.id for v in views]))}
    choices = {}
    for view in views:
        service = service_s(view, set_id, ledger.queued(view.id), costs, cost)
        choices[view.id] = Choice(view.id, ledger.remaining_s(view.id, now) + service, service)
    ordered = sorted(views, key=lambda v: (v.stale, choices[v.id].finish_s, home[v.id]))
    return [choices[v.id] for v in ordered]
