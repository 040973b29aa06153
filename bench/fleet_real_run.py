"""The cluster side of `bench.fleet --real` (bench/fleet_real.py): Ray and Serve on this machine, the stand-in
Hub with one tiny LoRA per adapter and SDXL-scaled download delays, and one application deployed per run, replaying
a request stream from closed-loop clients and then, for an open-loop run, at Poisson arrivals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.fleet_model import Catalogue, Costs
from bench.fleet_real import RealOptions, Sample, scaled_scenario

__all__ = ["Cluster"]

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
        self._runs = 0

    @staticmethod
    def repo(index: int) -> str:
        return f"fleet-real/lora-{index:04d}"

    def delay_downloads(self, k: float, seed: int) -> None:
        sizes = Catalogue(scaled_scenario(self.options, Costs(), clients=None), seed).size_mb
        for index, size in enumerate(sizes):
            self.hub.set_download_delay(self.repo(index), size / Costs.bandwidth_mb_s * k)

    def settings(self, router: str):
        from engine.settings import Settings

        return Settings(
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
        parameters = {"num_inference_steps": steps, "width": side, "height": side, "seed": index}
        body = {"inputs": "a lighthouse", "parameters": parameters}
        sent = time.perf_counter()
        try:
            answer = await client.post(url, json=body, headers={"lora": self.repo(adapter)})
        except httpx.HTTPError as e:
            print(f"request {index} failed: {type(e).__name__}: {e}", flush=True)
            return Sample(index, sent, time.perf_counter(), 0, False, "", {})
        done = time.perf_counter()
        timing = dict(
            (name, float(value))
            for name, _, value in (part.partition("=") for part in answer.headers.get("x-timing", "").split(";"))
            if value
        )
        hit = answer.headers.get("x-lora-cache", "").endswith("=hit")
        return Sample(index, sent, done, answer.status_code, hit, answer.headers.get("x-replica", ""), timing)

    def close(self) -> None:
        self.hub.stop()
