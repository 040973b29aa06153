"""Our Ray Serve request router (`CLUSTER_ROUTER=ours`): the policy of `serving.cluster.policy` on Serve 2.60.

`choose_replicas` ranks the replicas one per rank, in order of expected finish; `on_request_routed` and
`on_request_completed` keep our ledger of each replica's queue exact without waiting for reports; a replica
whose report is older than `stale_after_s` ranks last. Calls other than `generate` go to the replica with the
fewest of our requests. Serve's contract, as read: docs/internals.md, "serving/cluster/router.py".
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from serving.cluster.policy import Costs, Ledger, ReplicaView, pool_costs, rank, service_s, set_cost
from serving.cluster.stats import ReplicaStats, read_stats

__all__ = ["LeastFinishRouter"]

logger = logging.getLogger(__name__)

_GENERATE = "generate"


class LeastFinishRouter(RequestRouter):
    """Routes each `generate` to the replica where it is expected to finish first (`serving.cluster.policy`)."""

    def initialize_state(self, **kwargs: Any) -> None:
        """Serve calls this with `request_router_kwargs` (`serving.cluster.shape.router_kwargs`)."""
        self._stale_after_s = float(kwargs.get("stale_after_s", 5.0))
        self._defaults = Costs(
            inference_s=float(kwargs.get("inference_s", 8.5)),
            swap_s=float(kwargs.get("swap_s", 0.04)),
            prepare_s=float(kwargs.get("prepare_s", 0.45)),
            download_s=float(kwargs.get("download_s", 2.3)),
        )
        self._ledger = Ledger()
        self._first_seen: dict[str, float] = {}
        # Each replica's report as last parsed, with the dict it came from (parsed again only when it changes).
        self._parsed: dict[str, tuple[object, ReplicaStats | None]] = {}

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        now = time.time()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if pending_request is not None:
            # Without this Serve would try the ranks again at once, forever, while every replica is full.
            pending_request.routing_context.should_backoff = True
        views = self._views(candidate_replicas, now)
        if pending_request is None or pending_request.metadata.call_method != _GENERATE:
            stale = {v.id: v.stale for v in views}
            counts = {replica: self._ledger.queued(replica)[0] for replica in by_id}
            order = sorted(by_id, key=lambda r: (stale[r], counts[r], random.random()))
            return [[by_id[r]] for r in order]
        set_id = pending_request.metadata.multiplexed_model_id
        choices = rank(views, set_id, self._ledger, self._defaults, now)
        best = choices[0]
        self._ledger.send(pending_request.metadata.internal_request_id, best.replica, set_id, best.service_s, now)
        logger.debug("set %s -> %s", set_id, [(c.replica, round(c.finish_s, 3)) for c in choices])
        return [[by_id[c.replica]] for c in choices]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if pending_request.metadata.call_method != _GENERATE:
            return
        now = time.time()
        replica = replica_id.unique_id
        set_id = pending_request.metadata.multiplexed_model_id
        views = self._views(list(self.curr_replicas.values()), now)
        view = next((v for v in views if v.id == replica), ReplicaView(replica))
        costs = pool_costs(views, self._defaults)
        expected = service_s(view, set_id, self._ledger.queued(replica), costs, set_cost(views, set_id, costs))
        self._ledger.confirm(pending_request.metadata.internal_request_id, replica, expected, now)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._ledger.done(internal_request_id, time.time())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._ledger.forget_replica(replica_id.unique_id)
        self._parsed.pop(replica_id.unique_id, None)

    def _views(self, replicas: list[RunningReplica], now: float) -> list[ReplicaView]:
        views = []
        for replica in replicas:
            replica_id = replica.replica_id.unique_id
            first_seen = self._first_seen.setdefault(replica_id, now)
            stats = self._stats(replica_id, replica.routing_stats)
            # Stale: its last report is old, or it never reported although it has been up long enough to.
            reported = stats.at if stats is not None else first_seen
            stale = now - reported > self._stale_after_s
            views.append(ReplicaView(replica_id, stats, frozenset(replica.multiplexed_model_ids), stale))
        return views

    def _stats(self, replica_id: str, report: dict[str, Any]) -> ReplicaStats | None:
        cached = self._parsed.get(replica_id)
        if cached is not None and cached[0] is report:
            return cached[1]
        stats = read_stats(report)
        self._parsed[replica_id] = (report, stats)
        return stats
