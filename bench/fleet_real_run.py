"""The cluster side of `bench.fleet --real` (bench/fleet_real.py): Ray and Serve on this machine, the stand-in
Hub with one tiny LoRA per adapter and SDXL-scaled download delays, and one application deployed per run, replaying
a request stream from closed-loop clients and then, for an open-loop run, at Poisson arrivals.

With `video_share`, the requests `bench.fleet_model.request_kinds` draws as videos (the model's own draw) are sent
to a second pool, the tiny Wan's (its own deployment), each naming the adapter's Wan LoRA (one per adapter, its
download delayed as the adapter's): `video_steps` steps and `video_frames` frames on the stand-in GPU, which waits a
transformer block or a decode chunk at a time (`serving.cluster.standin`).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_model import Catalogue, Costs, phase_of, request_kinds, request_stream
from bench.fleet_real import (
    _SDXL_INFERENCE_S,
    _TARGET_S,
    POLICY_OF,
    RealOptions,
    RealRun,
    Sample,
    _compare,
    _measured_costs,
    _predicted_rates,
    _row,
    rates_around,
    scaled_costs,
    scaled_scenario,
    summarise,
    video_waits,
)

__all__ = ["Cluster", "measure"]

_TIMEOUT = httpx.Timeout(600.0)


class Cluster:
    """Ray and Serve on this machine, the stand-in Hub and its LoRAs; one application deployed per run."""

    def __init__(self, options: RealOptions, root: Path, hub_port: int) -> None:
        from engine.families.sdxl import build_tiny_pipeline
        from tests.support.loras import WEIGHTS, card, peft_file
        from tests.support.standin_hub import StandInHub

        self.options = options
        self.hub = StandInHub(root / "hub", port=hub_port)
        self.hub.start()
        pipe = build_tiny_pipeline(seed=0)
        for index in range(options.adapters):
            self.hub.add_repo(self.repo(index), {"README.md": card(), WEIGHTS: peft_file(pipe, seed=index)})
        if options.video_share:
            self._add_wan_loras()
        self._runs = 0
        self.kinds: list[bool] = []  # the run's requests that are videos (set by `measure`)
        self.video_waits = (0.0, 0.0)  # the stand-in's seconds per video step and decode chunk (set by `measure`)

    def _add_wan_loras(self) -> None:
        from engine.families.tiny_wan import build_tiny_pipeline
        from families.wan import MODEL_ID
        from tests.support.loras import WEIGHTS, card, sft
        from tests.support.wan import MODULES, factors, lora_file

        pipe: Any = build_tiny_pipeline(seed=0)  # (diffusers' stubs do not name its parts)
        transformer = pipe.transformer
        for index in range(self.options.adapters):
            tensors = lora_file(factors(transformer, MODULES[:4], seed=index), "peft", None)
            self.hub.add_repo(self.repo(index, True), {"README.md": card(MODEL_ID), WEIGHTS: sft(tensors)})

    @staticmethod
    def repo(index: int, video: bool = False) -> str:
        return f"fleet-real/{'wan-' if video else ''}lora-{index:04d}"

    def delay_downloads(self, k: float, seed: int) -> None:
        sizes = Catalogue(scaled_scenario(self.options, Costs()), seed).size_mb
        for index, size in enumerate(sizes):
            for video in (False, True) if self.options.video_share else (False,):
                self.hub.set_download_delay(self.repo(index, video), size / Costs.bandwidth_mb_s * k)

    def settings(self, router: str):
        from engine.models import PoolSetting
        from engine.settings import Settings
        from families.sdxl import MODEL_ID as SDXL
        from families.wan import MODEL_ID as WAN

        # With videos, a second pool: the tiny Wan's, its own deployment of as many replicas.
        pools = (PoolSetting("tiny", SDXL), PoolSetting("tiny-wan", WAN)) if self.options.video_share else ()
        return Settings(
            pools=pools,
            model_id="tiny",
            device="cpu",
            dtype="float32",
            cluster_router=router,  # type: ignore[arg-type]
            cluster_replicas=self.options.replicas,
            cluster_max_ongoing=1,
            cluster_adapter_sets=self.options.capacity,
            cluster_gpus_per_replica=0.0,
            cluster_cpu_threads=1,
            cluster_stats_period_s=0.5,
            cluster_own_hub_cache=True,
            # Inference as one GPU per replica would run it: a wait holding the slot and no core (0: on the CPU).
            cluster_standin_gpu_s=self.options.gpu_s,
            cluster_standin_video_step_s=self.video_waits[0],
            cluster_standin_video_chunk_s=self.video_waits[1],
            # The fleet model's replica: one preparation at a time, requests in order.
            prepare_workers=1,
            affinity_max_skip=0,
            previews=False,
            hub_timeout_s=120.0,
            log_level="WARNING",
        )

    def run(
        self, url: str, router: str, adapters: Sequence[int], gaps: Sequence[float] | None, clients: int = 0
    ) -> list[Sample]:
        """Deploy afresh under `router`, replay the stream (open loop at gaps, else closed loop with `clients`,
        by default the options'), undeploy."""
        from ray import serve

        from serving.cluster.app import build_app

        self._runs += 1
        name = f"fleet-real-{self._runs}"
        serve.run(build_app(self.settings(router)), name=name, route_prefix="/")
        try:
            return asyncio.run(self._replay(url, adapters, gaps, clients or self.options.clients))
        finally:
            serve.delete(name)

    async def _replay(
        self, url: str, adapters: Sequence[int], gaps: Sequence[float] | None, clients: int
    ) -> list[Sample]:
        samples: list[Sample] = []
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=_TIMEOUT, limits=limits) as client:

            async def one(index: int) -> None:
                samples.append(await self._send(client, url, index, adapters[index]))

            # The warm-up (everything, for a closed-loop run) from the closed-loop clients, as fast as they go.
            closed_until = len(adapters) if gaps is None else self.options.warmup

            async def closed(first: int) -> None:
                for index in range(first, closed_until, clients):
                    await one(index)

            await asyncio.gather(*(closed(c) for c in range(clients)))
            if gaps is not None:
                started, at, tasks = time.perf_counter(), 0.0, []
                for index in range(closed_until, len(adapters)):
                    at += gaps[index]
                    await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
                    tasks.append(asyncio.create_task(one(index)))
                await asyncio.gather(*tasks)
        return sorted(samples, key=lambda s: s.index)

    async def _send(self, client: httpx.AsyncClient, url: str, index: int, adapter: int) -> Sample:
        side, steps = self.options.side, self.options.steps
        video = bool(self.kinds) and self.kinds[index]
        parameters: dict[str, object] = {"num_inference_steps": steps, "width": side, "height": side, "seed": index}
        if video:  # the Wan pool's own size; the table's steps and frames
            parameters = {"num_inference_steps": self.options.video_steps, "num_frames": self.options.video_frames}
            parameters["seed"] = index
        body = {"inputs": "a lighthouse", "parameters": parameters}
        sent = time.perf_counter()
        try:
            answer = await client.post(url, json=body, headers={"lora": self.repo(adapter, video)})
        except httpx.HTTPError as e:
            print(f"request {index} failed: {type(e).__name__}: {e}", flush=True)
            return Sample(index, sent, time.perf_counter(), 0, False, "", {}, video)
        done = time.perf_counter()
        timing = dict(
            (name, float(value))
            for name, _, value in (part.partition("=") for part in answer.headers.get("x-timing", "").split(";"))
            if value
        )
        hit = answer.headers.get("x-lora-cache", "").endswith("=hit")
        if answer.status_code != 200:
            print(f"request {index} answered {answer.status_code}: {answer.text[:200]}", flush=True)
        replica = answer.headers.get("x-replica", "")
        return Sample(index, sent, done, answer.status_code, hit, replica, timing, video)

    def close(self) -> None:
        self.hub.stop()


def measure(options: RealOptions, root: Path, hub_port: int, say) -> dict[str, object]:
    """The whole real run: calibration, then for each router one deployment measured at each rate in turn, and
    the model beside each rate."""
    from serving.cluster.app import local_serve
    from tests.support.app_server import free_port

    began, load_start = time.perf_counter(), os.getloadavg()[0]
    cluster = Cluster(options, root, hub_port)
    runs: list[RealRun] = []
    try:
        with local_serve(port=free_port(), num_cpus=2) as url:
            inference = f"a stand-in GPU's {options.gpu_s} s wait" if options.gpu_s else "CPU inference"
            say(f"cluster up in {time.perf_counter() - began:.0f} s; {options.replicas} replicas, {inference}")
            calibration = _calibrate(cluster, url)
            service_s = calibration["service_s"]
            k = service_s / _SDXL_INFERENCE_S
            target = _TARGET_S * k
            say(f"calibration {calibration}: k={k:.4f}, p95 target {target:.2f} s")
            cluster.delay_downloads(k, options.seed)
            cluster.video_waits = video_waits(k)
            costs = scaled_costs(service_s, calibration["swap_s"], calibration["prepare_s"], options)
            knees = _predicted_rates(options, costs, target)
            # One grid of rates for both routers: their p95s compare at each rate.
            saturation = options.replicas / service_s
            if options.fractions is None:
                rates = rates_around(knees, saturation)
            else:
                rates = sorted(round(fraction * saturation, 3) for fraction in options.fractions)
            arrivals = sum(options.requests / rate for rate in rates)
            say(
                f"the model predicts {knees} req/s at the target; rates {rates} req/s, {options.requests} requests "
                f"each: {arrivals / 60:.1f} minutes of arrivals per router"
            )
            scenario = scaled_scenario(options, costs, phases=len(rates))
            adapters, gaps = request_stream(scenario, options.seed)
            cluster.kinds = request_kinds(scenario, options.seed, len(adapters))
            measured_videos = sum(cluster.kinds[options.warmup :])
            say(f"{sum(cluster.kinds)} of {len(adapters)} requests are videos, {measured_videos} measured")
            phase = [phase_of(index, scenario, len(rates)) for index in range(len(adapters))]
            spaced = [gap / rates[p] for gap, p in zip(gaps, phase, strict=True)]
            for router in POLICY_OF:
                samples = cluster.run(url, router, adapters, spaced)
                for number, rate in enumerate(rates):
                    mine = [s for s in samples if s.index >= options.warmup and phase[s.index] == number]
                    runs.append(summarise(router, rate, mine))
                    say(f"{router} at {rate} req/s: {_row(runs[-1])}")
    finally:
        cluster.close()
    measured = _measured_costs(runs, costs, calibration["overhead_s"])
    results = _compare(options, runs, measured, target, k, time.perf_counter() - began, say)
    # The machine's load over the run (1-minute averages at its start and end): others' work shares its cores.
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    say(f"load average: {load[0]} at the start, {load[1]} at the end ({os.cpu_count()} cores)")
    return {
        **results,
        "calibration": calibration,
        "predicted_rates": knees,
        "load_average": load,
        "cores": os.cpu_count(),
    }


def _calibrate(cluster: Cluster, url: str) -> dict[str, float]:
    """A hit's service time, what 8.5 s stands for: no download delays yet, one client per replica (with CPU
    inference the replicas share this machine's cores, so a replica's inference is slower while the others run,
    as it will be under load), 12 LoRAs (misses: their preparation and swap), then the same 12 three times (hits:
    inference on the replica, plus the overhead outside it: HTTP, Serve's proxy, the ingress, the router). The
    swap is the model's own step (on a miss and on most hits), so it is not counted in the service time; its cost
    is the median over every request that swapped."""
    replicas = cluster.options.replicas
    samples = cluster.run(url, "ours", [*range(12)] * 4, None, clients=replicas)
    misses, hits = [s for s in samples[:12] if s.status == 200], [s for s in samples[12:] if s.status == 200]
    if len(hits) < 18:
        raise RuntimeError(f"the calibration got {len(hits)} of 36 answers; the cluster does not serve")
    inference = statistics.median(s.timing["inference"] for s in hits)
    overhead = statistics.median(s.latency - s.timing["total"] for s in hits)
    return {
        "service_s": round(inference + overhead, 4),
        "inference_s": round(inference, 4),
        "overhead_s": round(overhead, 4),
        # Every swap of the calibration, hits' too: a median of 12 moved from 0.015 to 0.060 s with others' load.
        "swap_s": round(
            statistics.median(s.timing["apply"] for s in misses + hits if s.timing.get("apply", 0.0) > 0), 4
        ),
        "prepare_s": round(statistics.median(s.timing["prepare"] for s in misses), 4),
    }
