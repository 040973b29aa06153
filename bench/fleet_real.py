"""`python -m bench.fleet --real`: both routers on a real local Ray Serve cluster, the fleet model beside them.

The cluster, its clients and the run's sequence are in bench/fleet_real_run.py; the model and the comparison here.

Setup (needs requirements-ray.txt): Ray and Serve on this machine (`serving.cluster.app.local_serve`), one pool of
`replicas` replicas of the tiny pipeline (one torch thread each; each its own Hub-cache folder, as on a machine of
its own: `CLUSTER_OWN_HUB_CACHE`), `capacity` adapter sets each, and the stand-in Hub (tests/support) holding one
tiny LoRA per adapter.

Inference is a stand-in (`CLUSTER_STANDIN_GPU_S`, serving/cluster/standin.py): each replica's pipeline call waits
`gpu_s` seconds, the model's fixed inference time scaled, under the engine's pipeline lock with the request's slot
held, holding no core. The model assumes one GPU per replica, where one replica's inference never slows another's;
CPU replicas sharing 2 cores do (a tiny image took 0.38-1.45 s from run to run, and the p95s came out 1.4-5x the
model's), and no machine here has a core per replica. Everything else is real: Serve, both routers, routing
stats, the stand-in Hub's delayed downloads, preparation, the exact swap on the tiny pipeline's weights, the disk
and host caches. `gpu_s=0` (`--real-cpu-inference`) runs the real CPU inference instead, for contrast.

The time scale: T, the service time of a hit measured on the cluster first (the wait, plus the median overhead
outside the replica: HTTP, Serve's proxy, the ingress, the router), stands for SDXL's 8.5 s on an A10G:
k = T / 8.5 s. The model's inference time is T: the per-request overhead a real fleet has is in the model's
service time, measured once at the start on an idle cluster, not tuned. Each file's download is delayed by what
an SDXL LoRA of its drawn size (the fleet model's catalogue for the seed: log-uniform 20-900 MB) takes at 100 MB/s,
times k, and the p95 target is 13 s x k.

One deployment per router (new replicas: empty caches and disks), `CLUSTER_ROUTER=ours` or `ray_multiplexed`,
on the same Ray cluster, replays `bench.fleet_model.request_stream` for the seed: the same adapters and gaps for
both routers. The warm-up comes from `clients` closed-loop clients (as fast as the replicas go: a steady state of
disks and caches in a minute rather than hours), then `requests` Poisson arrivals at each rate in turn, lowest
first, without redeploying (each rate starts where the last left the caches; the model,
`bench.fleet_model.simulate_phases`, runs the same sequence). The three rates bracket the knees the model predicts
from the calibration (0.75 x the lower, their geometric mean, 1.25 x the higher), the same rates for both routers.
Measured per rate: p50/p95 from send to answer, with the p95's distribution-free 95 % interval (order statistics:
with 200 requests the 184th to 197th latency), and the hit rate (`X-Lora-Cache`). The fleet model then runs the same
scenario (same seed, requests, warm-up and rates; the costs the cluster measured: inference, swap, prepare) for
each policy: `sim_gap` is the mean |measured - model| hit rate over a router's rates, `p95_gap` is
|measured / model - 1| at each rate, averaged over the rates where the model's p95 is within twice the target
(past that a p95 measures how long a run lets an overloaded queue grow, not the router). `ratio` is ours_rate /
ray_rate, each the highest rate whose measured p95 is within the target, interpolated between the rates
measured; a router within the target at no rate has no rate (`na`, and so has the ratio), one within it at every
rate has a lower bound (said so). The model itself, run over other seeds of this scenario, finds ratios from
1.2 to 2.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.stats import binom

from bench.fleet_model import Costs, Scenario, percentile, simulate, simulate_phases
from bench.fleet_policies import make_policy
from bench.fleet_sweep import latency_curve, max_rate
from bench.mixed import WAN_A10G, WAN_STEP_S

__all__ = [
    "POLICY_OF",
    "RealOptions",
    "RealRun",
    "p95_interval",
    "rate_at_target",
    "rates_around",
    "ratio_of",
    "scaled_scenario",
    "summarise",
]

# Our router is the fleet model's least_finish; Serve's multiplexed router with one slot is ray_multiplexed_m1.
POLICY_OF = {"ours": "least_finish", "ray_multiplexed": "ray_multiplexed_m1"}
_SDXL_INFERENCE_S = Costs.inference_s
_TARGET_S = 13.0
# Around the model's knees: under the lower (x 0.75), between the two (their geometric mean), over the higher
# (x 1.25); no rate under a tenth of saturation (a rate costs `requests` / rate seconds: three rates keep a default
# run within about 15 minutes on 2 cores).
_AROUND = (0.75, 1.25)
_FLOOR = 0.1


@dataclass(frozen=True)
class RealOptions:
    # The fleet model's 5 replicas (docs/fleet.md); its catalogue (2,500) and sets (16) scaled down, keeping
    # 5 x 8 sets for 100 adapters, so that a few hundred requests reach a steady state (the model's warm-up of
    # 12,000 would take hours per run). About 15 minutes on 2 quiet cores.
    replicas: int = 5
    adapters: int = 100
    capacity: int = 8
    warmup: int = 300
    # Measured requests per rate: the p95 is the 190th of 200, its 95 % interval the 184th to 197th (p95_interval).
    requests: int = 200
    clients: int = 6  # closed loop: the warm-up's clients
    steps: int = 2
    side: int = 64
    # Open-loop rates as fractions of saturation (every replica busy with inference alone); None: around the knees
    # the model predicts from the calibration (rates_around).
    fractions: tuple[float, ...] | None = None
    seed: int = 0
    # The stand-in GPU's inference time (CLUSTER_STANDIN_GPU_S); 0: real inference on the CPU cores, for contrast.
    gpu_s: float = 0.5
    # The share of requests that are videos of a tiny Wan pool (its own deployment, `replicas` replicas, a Wan LoRA
    # per adapter), on the stand-in GPU at `bench.mixed`'s Wan 2.1 1.3B table scaled by k: `video_steps` steps of
    # 9.2 s x k and a decode of 1.0 s x k per latent frame of `video_frames`; 0: images only.
    video_share: float = 0.0
    video_steps: int = 50
    video_frames: int = 81


@dataclass(frozen=True)
class Sample:
    index: int
    sent: float
    done: float
    status: int
    hit: bool
    replica: str
    timing: dict[str, float]
    video: bool = False

    @property
    def latency(self) -> float:
        return self.done - self.sent


@dataclass(frozen=True)
class RealRun:
    """One rate on the cluster under one router, and what was measured there."""

    router: str
    rate: float  # offered req/s
    completed: int
    failed: int
    hit_rate: float
    p50_s: float
    p95_s: float
    throughput: float
    inference_s: float
    swap_s: float
    prepare_s: float
    # Where the tail came from: the p95 of the replica's own time (queue, load, swap, inference: `X-Timing`'s
    # total) and of the rest of each request's latency (HTTP, the ingress, Serve's routing and backoff).
    p95_replica_s: float = math.nan
    p95_outside_s: float = math.nan
    # The p95's distribution-free 95 % interval (p95_interval).
    p95_low_s: float = math.nan
    p95_high_s: float = math.nan
    # With videos in the traffic: p50/p95 and their interval are the images' (the target's), these the videos'.
    videos: int = 0
    video_p95_s: float = math.nan


def scaled_scenario(options: RealOptions, costs: Costs, phases: int = 1) -> Scenario:
    """The cluster's scenario: `phases` rates of `options.requests` each after a closed-loop warm-up."""
    return Scenario(
        adapters=options.adapters,
        replicas=options.replicas,
        capacity=options.capacity,
        disk_gb=1e6,  # each replica's own Hub-cache folder keeps every file it downloaded
        zipf=1.1,
        warmup=options.warmup,
        requests=options.requests * phases,
        # The warm-up is sent by the closed-loop clients first, as fast as the replicas go.
        warmup_clients=options.clients,
        costs=costs,
        video_share=options.video_share,
        # The cluster runs each pool as its own deployment, one process per replica with a device of its own: no
        # run waits for another pool's (step sharing between pools needs a replica holding both: not done yet).
        device_sharing="off",
    )


def scaled_costs(inference_s: float, swap_s: float, prepare_s: float, options: RealOptions | None = None) -> Costs:
    """The model's costs for the cluster: its measured steps, downloads as SDXL's scaled by k = T / 8.5 s, and a
    video as the stand-in's (`video_waits`: a piece a step, the pieces' split matters only when a device is shared)."""
    k = inference_s / _SDXL_INFERENCE_S
    step_s, chunk_s = video_waits(k)
    video = options or RealOptions()
    return Costs(
        video_pieces=video.video_steps,
        video_piece_s=step_s,
        video_decode_pieces=video_chunks(video.video_frames),
        video_decode_s=chunk_s,
        video_step_pieces=1,
        inference_s=inference_s,
        swap_cpu_s=swap_s,
        swap_scale=1.0,
        prepare_base_s=prepare_s,
        prepare_s_per_mb=0.0,  # the tiny files cost the same to prepare whatever size they stand for
        bandwidth_mb_s=Costs.bandwidth_mb_s / k,
    )


def video_waits(k: float) -> tuple[float, float]:
    """The stand-in's seconds per video step and per decode chunk (CLUSTER_STANDIN_VIDEO_STEP_S, _CHUNK_S):
    `bench.mixed`'s A10G table (Wan 2.1 1.3B, its sources there) scaled by k."""
    return WAN_STEP_S * k, WAN_A10G[3] * k


def video_chunks(frames: int) -> int:
    """A video's decode chunks: its latent frames (Wan's VAE compresses time 4x), as the engine counts them."""
    return (frames - 1) // 4 + 1


def rates_around(knees: Mapping[str, float], saturation: float) -> list[float]:
    """The rates to measure, ascending: one under the lower of the model's knees, one between the two, one over the
    higher: each router's knee is bracketed by two of them. A router the model finds within the target at no rate
    (0) counts as a knee at the lowest rate allowed, so that it is measured there all the same."""
    floor = _FLOOR * saturation
    found = [max(knee, floor) for knee in knees.values()]
    low, high = min(found), max(found)
    rates = (low * _AROUND[0], math.sqrt(low * high), high * _AROUND[1])
    return sorted({round(max(rate, floor), 3) for rate in rates})


def p95_interval(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """The ranks (1-based, of n ascending latencies) that hold the true p95 with `confidence`, whatever the
    distribution: the number of latencies under the p95 is Binomial(n, 0.95) (order statistics)."""
    tail = (1 - confidence) / 2
    low = int(binom.ppf(tail, n, 0.95))
    high = int(binom.ppf(1 - tail, n, 0.95)) + 1
    return max(1, low), min(n, high)


def rate_at_target(points: Sequence[tuple[float, float]], target_s: float) -> tuple[float, str]:
    """The highest rate with p95 within `target_s`, interpolated between measured (rate, p95) points; with how it
    was found: "interpolated", "lower bound" (every rate tried was within) or "none" (none was)."""
    ordered = sorted(points)
    within = [(rate, p95) for rate, p95 in ordered if p95 <= target_s]
    if not within:
        return 0.0, "none"
    last = within[-1]
    above = [(rate, p95) for rate, p95 in ordered if rate > last[0] and p95 > target_s]
    if not above:
        return last[0], "lower bound"
    (r0, p0), (r1, p1) = last, above[0]
    return r0 + (r1 - r0) * (target_s - p0) / (p1 - p0), "interpolated"


def ratio_of(ours: Mapping[str, object], ray: Mapping[str, object]) -> tuple[float | None, str]:
    """ours_rate / ray_rate, with what it is: "measured", "lower bound" or "upper bound" (a router within the target
    at every rate tried has only a lower bound for its rate), or None with why not."""
    if "none" in (ours["found"], ray["found"]):
        who = [name for name, s in (("ours", ours), ("Serve's", ray)) if s["found"] == "none"]
        return None, f"not measured: {' and '.join(who)} within the target at no rate tried"
    kinds = (ours["found"] == "lower bound", ray["found"] == "lower bound")
    if all(kinds):
        return None, "not measured: both within the target at every rate tried"
    ratio = float(ours["rate_at_target"]) / float(ray["rate_at_target"])  # type: ignore[arg-type]
    return ratio, "lower bound" if kinds[0] else "upper bound" if kinds[1] else "measured"


def summarise(router: str, rate: float, samples: Sequence[Sample]) -> RealRun:
    """One rate's measured requests (after the warm-up); latencies are the images' (videos' apart)."""
    ok = [s for s in samples if s.status == 200]
    latencies = sorted(s.latency for s in ok if not s.video)
    videos = [s.latency for s in ok if s.video]
    span = max(s.done for s in ok) - min(s.sent for s in ok) if ok else 0.0
    low, high = p95_interval(len(latencies)) if latencies else (0, 0)

    def mean(name: str, where=lambda s: True) -> float:
        values = [s.timing[name] for s in ok if name in s.timing and where(s) and not s.video]
        return statistics.fmean(values) if values else math.nan

    return RealRun(
        router=router,
        rate=rate,
        completed=len(ok),
        failed=len(samples) - len(ok),
        hit_rate=sum(s.hit for s in ok) / len(ok) if ok else math.nan,
        p50_s=percentile(latencies, 50) if latencies else math.nan,
        p95_s=percentile(latencies, 95) if latencies else math.nan,
        throughput=len(ok) / span if span else 0.0,
        inference_s=mean("inference"),
        swap_s=mean("apply", lambda s: s.timing.get("apply", 0.0) > 0),
        prepare_s=mean("prepare", lambda s: not s.hit),
        p95_replica_s=_p95([s.timing["total"] for s in ok if "total" in s.timing and not s.video]),
        p95_outside_s=_p95([s.latency - s.timing["total"] for s in ok if "total" in s.timing and not s.video]),
        p95_low_s=latencies[low - 1] if latencies else math.nan,
        p95_high_s=latencies[high - 1] if latencies else math.nan,
        videos=len(videos),
        video_p95_s=_p95(videos),
    )


def _p95(values: Sequence[float]) -> float:
    return percentile(sorted(values), 95) if values else math.nan


def _predicted_rates(options: RealOptions, costs: Costs, target: float) -> dict[str, float]:
    """What the model predicts: its highest rate within the target, the median over five seeds (one seed's few
    hundred requests make it noisy); 0 where it finds none."""
    scenario = scaled_scenario(options, costs)
    rates = {}
    for router, policy in POLICY_OF.items():
        found = [
            max_rate(scenario, policy, latency_curve(scenario, policy, seed), target, seed).rate
            for seed in range(options.seed, options.seed + 5)
        ]
        rates[router] = round(statistics.median(found), 3)
    return rates


def _measured_costs(runs: Sequence[RealRun], fallback: Costs, overhead_s: float) -> Costs:
    """The model's costs as the runs measured them; inference with the per-request overhead outside the replica's
    work (HTTP, the ingress, Serve's routing) measured at the start, which a client waits for as for inference."""

    def mean(name: str, default: float) -> float:
        values = [getattr(r, name) for r in runs if not math.isnan(getattr(r, name))]
        return statistics.fmean(values) if values else default

    return dataclasses.replace(
        fallback,
        inference_s=mean("inference_s", fallback.inference_s - overhead_s) + overhead_s,
        swap_cpu_s=mean("swap_s", fallback.swap_cpu_s),
        prepare_base_s=mean("prepare_s", fallback.prepare_base_s),
    )


def _compare(
    options: RealOptions, runs: list[RealRun], costs: Costs, target: float, k: float, wall: float, say
) -> dict[str, object]:
    """The model on each router's sequence of rates, the gaps, and each router's rate at the target."""
    rows, result = [], {}
    for router, policy in POLICY_OF.items():
        mine = sorted((run for run in runs if run.router == router), key=lambda run: run.rate)
        scenario = scaled_scenario(options, costs, phases=len(mine))
        sims = simulate_phases(scenario, make_policy(policy), [run.rate for run in mine], options.seed) if mine else []
        # With videos the p95 compared is the images' (the target's) on both sides; the measured one already is.
        pairs = [
            {"measured": dataclasses.asdict(r), "simulated": {**dataclasses.asdict(s), "p95_s": s.target_p95_s}}
            for r, s in zip(mine, sims, strict=True)
        ]
        for run, sim in zip(mine, sims, strict=True):
            videos = f"  {run.videos} videos p95 {run.video_p95_s:.1f} s (model {sim.video_p95_s:.1f} s)"
            say(
                f"{router:<16} {run.rate:7.3f}  hit {run.hit_rate:.3f} (model {sim.hit_rate:.3f})  "
                f"p95 {run.p95_s:.2f} s [{run.p95_low_s:.2f}, {run.p95_high_s:.2f}] (model {sim.target_p95_s:.2f} s)"
                + (videos if options.video_share else "")
            )
        rows.extend(pairs)
        rate, how = rate_at_target([(run.rate, run.p95_s) for run in mine], target)
        p95_gaps, p95_gap = _p95_gaps(pairs, target)
        model = scaled_scenario(options, costs)
        top = max((run.rate for run in mine), default=1.0)
        curve = [
            simulate(model, make_policy(policy), round(f * top / 1.2, 4), options.seed)
            for f in (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4)
        ]
        gaps = [abs(pair["measured"]["hit_rate"] - pair["simulated"]["hit_rate"]) for pair in pairs]
        result[router] = {
            "model_rate_at_target": max_rate(
                model, policy, latency_curve(model, policy, options.seed), target, options.seed
            ).rate,
            "model_curve": [dataclasses.asdict(r) for r in curve],
            "rate_at_target": rate,
            "found": how,
            "hit_rate": statistics.fmean(run.hit_rate for run in mine) if mine else math.nan,
            "sim_gap": statistics.fmean(gaps) if gaps else math.nan,
            "sim_gaps": gaps,
            "p95_measured_over_model": [p["measured"]["p95_s"] / p["simulated"]["p95_s"] for p in pairs],
            "p95_gaps": p95_gaps,
            "p95_gap": p95_gap,
        }
    return {
        "benchmark": "fleet_real",
        "options": dataclasses.asdict(options),
        "k": k,
        "target_p95_s": target,
        "costs": dataclasses.asdict(costs),
        "runs": rows,
        "routers": result,
        "wall_s": round(wall, 1),
    }


def _p95_gaps(pairs: Sequence[dict], target: float) -> tuple[list[float], float]:
    """|measured p95 / model p95 - 1| at each rate, and their mean over the rates where the model's p95 is within
    twice the target (past that a p95 measures how long the run let an overloaded queue grow); NaN if none is."""
    gaps = [abs(row["measured"]["p95_s"] / row["simulated"]["p95_s"] - 1) for row in pairs]
    near = [gap for gap, row in zip(gaps, pairs, strict=True) if row["simulated"]["p95_s"] <= 2 * target]
    return gaps, statistics.fmean(near) if near else math.nan


def _row(run: RealRun) -> str:
    return (
        f"{run.completed} ok, {run.failed} failed, hit {run.hit_rate:.3f}, p50 {run.p50_s:.2f} s, "
        f"p95 {run.p95_s:.2f} s (95 % interval {run.p95_low_s:.2f}-{run.p95_high_s:.2f}; on the replica "
        f"{run.p95_replica_s:.2f} s, outside {run.p95_outside_s:.2f} s), {run.throughput:.2f} req/s "
        f"(inference {run.inference_s:.3f} s)"
    )
