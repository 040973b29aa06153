"""`GET /metrics`: the engine's events and levels in Prometheus' text format, through `prometheus_client`.

Off unless `METRICS=1` (a public Space would publish these numbers to anyone). One `Metrics` per app,
each with its own `CollectorRegistry` rather than the process-wide default, so tests and several apps in
one process never share or clash over series.

Counts and durations are pushed by the engines' events (`engine.events`, an observer this module implements,
subscribed through the backend); levels — queue length, bytes per cache tier, adapters cached and fused — are
read from the backend's pool statuses when scraped, so they are never stale and nothing keeps them in step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from engine.events import RunShare, Tier

if TYPE_CHECKING:
    from engine.outcomes import EngineStatus
    from serving.backends import Backend

__all__ = ["PREFIX", "TRANSPORTS", "Metrics"]

PREFIX = "switchboard"
# Label values of `requests_total{transport}`: the HTTP endpoint, the UI's button, gradio_client's named API, and a
# cluster front end's `/v1/generate` (what a Space with BACKEND_URL sends it).
TRANSPORTS = ("http", "ui", "gradio_api", "wire")
TIERS: tuple[Tier, ...] = ("host", "device")
# Seconds. Swaps are milliseconds (one addmm_ per layer); downloads and inference are seconds to minutes.
_SWAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """The app's metrics: an engine observer plus a scrape-time collector, in a registry of its own."""

    def __init__(self, backend: Backend) -> None:
        self.registry = CollectorRegistry()
        self._backend = backend
        # The statuses of the scrape under way: read on the event loop, encoded in a worker thread.
        self._statuses: tuple[EngineStatus, ...] = ()
        self._lock = threading.Lock()
        registry = self.registry
        self._requests = Counter(
            f"{PREFIX}_requests",
            "Generation requests answered, by transport and HTTP status (499: the client went away).",
            ["transport", "status"],
            registry=registry,
        )
        self._queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time a request waited for the pipeline.",
            buckets=_SLOW_BUCKETS,
            registry=registry,
        )
        self._prepare = Histogram(
            f"{PREFIX}_prepare_seconds",
            "Time to make a request's LoRAs ready (resolve; on a miss download, convert, cache).",
            buckets=_SLOW_BUCKETS,
            registry=registry,
        )
        self._swap = Histogram(
            f"{PREFIX}_swap_seconds",
            "Time of one swap of the fused adapter set.",
            buckets=_SWAP_BUCKETS,
            registry=registry,
        )
        self._inference = Histogram(
            f"{PREFIX}_inference_seconds",
            "Time the pipeline spent generating one image.",
            buckets=_SLOW_BUCKETS,
            registry=registry,
        )
        self._hits = Counter(f"{PREFIX}_cache_hits", "Adapter cache hits, by tier.", ["tier"], registry=registry)
        self._misses = Counter(f"{PREFIX}_cache_misses", "Adapter cache misses, by tier.", ["tier"], registry=registry)
        self._evictions = Counter(
            f"{PREFIX}_cache_evictions", "Adapters evicted to make room, by tier.", ["tier"], registry=registry
        )
        self._evicted_bytes = Counter(
            f"{PREFIX}_cache_evicted_bytes", "Bytes evicted to make room, by tier.", ["tier"], registry=registry
        )
        self._hub_errors = Counter(
            f"{PREFIX}_hub_errors",
            "Failures talking to the Hugging Face Hub while preparing LoRAs, by error class.",
            ["error_type"],
            registry=registry,
        )
        # The device shared by the pools' runs (engine.pipeline.stepshare): its time per pool, the pauses.
        self._device, self._pauses, self._paused, self._step_wait = _sharing_metrics(registry)
        for tier in TIERS:
            # Present at zero from the start, so a rate() over the first scrapes is not empty.
            for counter in (self._hits, self._misses, self._evictions, self._evicted_bytes):
                counter.labels(tier=tier)
        registry.register(_Levels(self))
        backend.subscribe(self)

    # -- wiring ----------------------------------------------------------------------------------

    def statuses(self) -> tuple[EngineStatus, ...]:
        with self._lock:
            return self._statuses

    def routes(self) -> list[BaseRoute]:
        """`GET /metrics`, answered in the format the scraper asks for (Prometheus text or OpenMetrics)."""

        async def metrics(request: Request) -> Response:
            encode, media_type = choose_encoder(request.headers.get("accept", ""))
            statuses = tuple(pool.engine for pool in await self._backend.status())
            with self._lock:
                self._statuses = statuses
            body = await anyio.to_thread.run_sync(encode, self.registry)
            return Response(body, headers={"Content-Type": media_type})

        return [Route("/metrics", metrics, methods=["GET"], name="metrics")]

    # -- engine events (engine.events.EngineObserver) ------------------------------------------------

    def request_done(self, transport: str, status: int) -> None:
        self._requests.labels(transport=transport, status=str(status)).inc()

    def queue_waited(self, seconds: float) -> None:
        self._queue_wait.observe(seconds)

    def prepared(self, seconds: float) -> None:
        self._prepare.observe(seconds)

    def swapped(self, seconds: float) -> None:
        self._swap.observe(seconds)

    def inferred(self, seconds: float) -> None:
        self._inference.observe(seconds)

    def cache_lookup(self, tier: Tier, hit: bool) -> None:
        (self._hits if hit else self._misses).labels(tier=tier).inc()

    def evicted(self, tier: Tier, nbytes: int) -> None:
        self._evictions.labels(tier=tier).inc()
        self._evicted_bytes.labels(tier=tier).inc(nbytes)

    def hub_error(self, error_type: str) -> None:
        self._hub_errors.labels(error_type=error_type).inc()

    def device_shared(self, share: RunShare) -> None:
        self._device.labels(pool=share.pool).inc(share.device_s)
        self._pauses.labels(pool=share.pool).inc(share.pauses)
        self._paused.observe(share.paused_s)
        self._step_wait.observe(share.longest_wait_s)


def _sharing_metrics(registry: CollectorRegistry) -> tuple[Counter, Counter, Histogram, Histogram]:
    """Device time and pauses per pool, paused seconds and the longest wait for a step per run."""
    return (
        Counter(f"{PREFIX}_device_seconds", "Device time held by runs, by pool.", ["pool"], registry=registry),
        Counter(f"{PREFIX}_run_pauses", "Runs paused for another pool's step, by pool.", ["pool"], registry=registry),
        Histogram(f"{PREFIX}_run_paused_seconds", "Time one run was paused.", buckets=_SLOW_BUCKETS, registry=registry),
        Histogram(
            f"{PREFIX}_step_wait_max_seconds",
            "The longest one run waited for the device before one of its steps (its start included).",
            buckets=_SLOW_BUCKETS,
            registry=registry,
        ),
    )


class _Levels:
    """Gauges from the pools' statuses of this scrape (a custom collector, as prometheus_client suggests)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering does not read engine state.
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        statuses = self._metrics.statuses()
        queue, cached, active, cache_bytes, budget = self._families()
        queue.add_metric([], sum(s.waiting for s in statuses))
        cached.add_metric([], sum(len(s.cached) for s in statuses))
        active.add_metric([], sum(len(s.applied) for s in statuses))
        cache_bytes.add_metric(["host"], sum(s.host_bytes for s in statuses))
        cache_bytes.add_metric(["device"], sum(s.device_bytes for s in statuses))
        budget.add_metric(["host"], sum(s.host_budget for s in statuses))
        budget.add_metric(["device"], sum(s.device_budget for s in statuses))
        yield from (queue, cached, active, cache_bytes, budget)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                f"{PREFIX}_queue_length", "Requests waiting for the pipeline now (the running one excluded)."
            ),
            GaugeMetricFamily(f"{PREFIX}_cached_adapters", "Adapters in the host cache now."),
            GaugeMetricFamily(f"{PREFIX}_active_adapters", "Adapters fused into the served weights now."),
            GaugeMetricFamily(f"{PREFIX}_cache_bytes", "Bytes held by each adapter cache tier now.", labels=["tier"]),
            GaugeMetricFamily(f"{PREFIX}_cache_budget_bytes", "Byte budget of each cache tier.", labels=["tier"]),
        )
