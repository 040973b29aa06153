"""The Ray Serve cluster on this machine: the fleet model's validation run, and `max_ongoing_requests` 1 vs more.

    python -m bench.cluster validate --out docs/cluster-validation.json   # then:
    python -m bench.fleet --validate-json docs/cluster-validation.json
    python -m bench.cluster ongoing --out docs/cluster-ongoing.json --values 1,2
    python -m bench.cluster coldstart --out docs/cluster-coldstart.json

Needs requirements-ray.txt. Starts a local Ray instance (2 CPUs) with two CPU replicas of the tiny
pipeline and local synthetic LoRAs, one file per adapter of the scenario.

`validate` replays `bench.fleet --validation-spec`: for each seed, the adapters of
`bench.fleet_model.request_stream` in order from one sequential client, with Serve's multiplexed routing
(`CLUSTER_MAX_ONGOING=1`) and 3 adapter sets per replica; a hit is a request whose LoRA the replica had
prepared (`X-Lora-Cache: …=hit`; the engine's cache follows Serve's LRU), counted after the warm-up
requests. Each seed uses its own files, so what earlier seeds left in the caches is never asked for again.

`ongoing` saturates the cluster (4 closed-loop clients, twice the replicas) with a Zipf stream over 30
adapters for each `max_ongoing_requests` value, and reports hit rate and latency percentiles side by side.

`coldstart` deploys a tiny SDXL pool and a tiny SD 1.5 pool scaled to zero, and times the SD 1.5 pool's first
request (Serve starts its replica) against the next ones, with the replica's own pipeline load and warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.fleet_model import percentile, request_stream
from bench.fleet_sweep import scenario_from_dict, validation_spec

_STEPS = 1
_TIMEOUT = httpx.Timeout(600.0)


def _write_loras(folder: Path, names: Sequence[str]) -> None:
    from engine.families.sdxl import build_tiny_pipeline
    from serving.demo.synthetic import UNET_ATTENTION, find_targets, make_lora, peft_metadata, save_lora

    pipe = build_tiny_pipeline(seed=0)
    targets = find_targets({"unet": pipe.unet}, {"unet": UNET_ATTENTION})
    for i, name in enumerate(names):
        tensors = make_lora(targets, rank=4, seed=1000 + i)
        save_lora(folder / f"{name}.safetensors", tensors, peft_metadata(targets, rank=4, alpha=4.0))


def _settings(lora_dir: Path, *, sets: int, ongoing: int):
    from engine.settings import Settings

    return Settings(
        model_id="tiny",
        device="cpu",
        dtype="float32",
        local_lora_dir=lora_dir,
        # Both runs measure Serve's own multiplexed router (the fleet model's ray_multiplexed_m<N>).
        cluster_router="ray_multiplexed",
        cluster_cpu_threads=1,
        cluster_replicas=2,
        cluster_max_ongoing=ongoing,
        cluster_adapter_sets=sets,
        cluster_gpus_per_replica=0.0,
        log_level="WARNING",
    )


def _post(client: httpx.Client, url: str, lora: str, seed: int) -> tuple[bool, float, str]:
    started = time.perf_counter()
    body = json.dumps({"inputs": "a fox", "parameters": {"num_inference_steps": _STEPS, "seed": seed}})
    response = client.post(url, content=body, headers={"lora": f"local:{lora}.safetensors"})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"the cluster answered {response.status_code}: {response.text[:300]}")
    return response.headers["x-lora-cache"].endswith("=hit"), elapsed, response.headers["x-replica"]


def validate(out: Path, port: int) -> dict[str, object]:
    from serving.cluster.app import local_cluster

    spec = validation_spec()
    scenario = scenario_from_dict(spec["scenario"])  # type: ignore[arg-type]
    seeds = int(spec["seeds"])  # type: ignore[call-overload]
    streams = {seed: request_stream(scenario, seed)[0] for seed in range(seeds)}
    per_seed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cluster-loras-") as tmp:
        folder = Path(tmp)
        _write_loras(folder, [f"s{seed}-a{a}" for seed in range(seeds) for a in range(scenario.adapters)])
        settings = _settings(folder, sets=scenario.capacity, ongoing=1)
        started = time.perf_counter()
        with local_cluster(settings, port=port) as url, httpx.Client(timeout=_TIMEOUT) as client:
            print(f"cluster up in {time.perf_counter() - started:.0f} s", flush=True)
            for seed, adapters in streams.items():
                hits = []
                for i, adapter in enumerate(adapters):
                    hit, _, _ = _post(client, url, f"s{seed}-a{adapter}", seed=i)
                    if i >= scenario.warmup:
                        hits.append(hit)
                per_seed.append(sum(hits) / len(hits))
                print(f"seed {seed}: hit rate {per_seed[-1]:.3f} over {len(hits)} requests", flush=True)
    result = {**spec, "measured_hit_rate": statistics.fmean(per_seed), "measured_per_seed": per_seed}
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def ongoing(out: Path, port: int, values: Sequence[int], requests: int, clients: int) -> dict[str, object]:
    from serving.cluster.app import local_cluster

    spec = validation_spec()
    scenario = scenario_from_dict(spec["scenario"])  # type: ignore[arg-type]
    adapters = request_stream(scenario, 0)[0][:requests]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="cluster-loras-") as tmp:
        folder = Path(tmp)
        for value in values:
            names = [f"m{value}-a{a}" for a in range(scenario.adapters)]
            _write_loras(folder, names)
            settings = _settings(folder, sets=scenario.capacity, ongoing=value)
            with local_cluster(settings, port=port) as url:
                runs[str(value)] = _saturate(url, [names[a] for a in adapters], clients, scenario.warmup)
            print(f"max_ongoing_requests={value}: {runs[str(value)]}", flush=True)
    result = {
        "replicas": 2,
        "adapters": scenario.adapters,
        "capacity": scenario.capacity,
        "clients": clients,
        "runs": runs,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _saturate(url: str, loras: Sequence[str], clients: int, warmup: int) -> dict[str, float]:
    """Closed loop: `clients` threads take the next request from one shared sequence as soon as they are free."""
    lock, results, position = threading.Lock(), [], iter(range(len(loras)))

    def client() -> None:
        with httpx.Client(timeout=_TIMEOUT) as http:
            while True:
                with lock:
                    i = next(position, None)
                if i is None:
                    return
                hit, elapsed, _ = _post(http, url, loras[i], seed=i)
                with lock:
                    results.append((i, hit, elapsed))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    counted = [(hit, elapsed) for i, hit, elapsed in results if i >= warmup]
    latencies = sorted(elapsed for _, elapsed in counted)
    return {
        "hit_rate": round(sum(hit for hit, _ in counted) / len(counted), 3),
        "p50_s": round(percentile(latencies, 50), 3),
        "p95_s": round(percentile(latencies, 95), 3),
        "throughput_rps": round(len(results) / wall, 2),
        "requests": len(counted),
    }


def coldstart(out: Path, port: int, repeats: int) -> dict[str, object]:
    """Two pools, the SD 1.5 one scaled to zero (autoscaling, `CLUSTER_SCALE_TO_ZERO`): its first request waits for
    a replica to start (a cold start), the next ones find it warm; the SDXL pool stays up throughout."""
    from ray import serve

    from engine.models import PoolSetting
    from engine.settings import DEFAULT_MODEL_ID, Settings
    from families.sd15 import MODEL_ID as SD15_MODEL_ID
    from serving.cluster.app import deployment_name, local_cluster

    settings = Settings(
        pools=(PoolSetting("tiny", DEFAULT_MODEL_ID), PoolSetting("tiny-sd15", SD15_MODEL_ID)),
        device="cpu",
        dtype="float32",
        cluster_replicas=1,
        cluster_max_replicas=1,
        cluster_scale_to_zero=("tiny-sd15",),
        cluster_gpus_per_replica=0.0,
        cluster_cpu_threads=1,
        log_level="WARNING",
    )
    body = json.dumps({"inputs": "a fox", "parameters": {"num_inference_steps": _STEPS, "seed": 1}})
    with local_cluster(settings, port=port) as url, httpx.Client(timeout=_TIMEOUT) as client:
        pool = serve.status().applications["switchboard"].deployments[deployment_name(SD15_MODEL_ID)]
        before = pool.replica_states.get("RUNNING", 0)
        times = []
        for _ in range(1 + repeats):
            started = time.perf_counter()
            answer = client.post(f"{url}models/{SD15_MODEL_ID}", content=body)
            if answer.status_code != 200:
                raise RuntimeError(f"the cluster answered {answer.status_code}: {answer.text[:300]}")
            times.append(time.perf_counter() - started)
        status = client.get(f"{url}v1/status", params={"base": SD15_MODEL_ID}).json()
    warm = statistics.median(times[1:])
    result = {
        "replicas_before": before,
        "cold_s": round(times[0], 2),
        "warm_median_s": round(warm, 3),
        "pipeline_load_s": round(status["load_s"], 2),
        "pipeline_warmup_s": round(status["warmup_s"], 2),
        # What the cold start costs beyond the pipeline: Serve's scale-up, the actor's process and imports.
        "serve_and_process_s": round(times[0] - warm - status["load_s"] - status["warmup_s"], 2),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", choices=("validate", "ongoing", "coldstart"))
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--values", default="1,2", help="max_ongoing_requests values for `ongoing`")
    parser.add_argument("--requests", type=int, default=220, help="requests per value for `ongoing`")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients for `ongoing`")
    args = parser.parse_args(argv)
    if args.run == "coldstart":
        print(f"cluster: coldstart {coldstart(args.out, args.port, repeats=5)} -> {args.out}")
    elif args.run == "validate":
        result = validate(args.out, args.port)
        print(f"cluster: measured_hit_rate={result['measured_hit_rate']:.3f} -> {args.out}")
    else:
        values = [int(v) for v in args.values.split(",")]
        ongoing(args.out, args.port, values, args.requests, args.clients)


if __name__ == "__main__":
    main()
