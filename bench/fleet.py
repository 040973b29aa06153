"""The fleet model: thousands of LoRAs on a few GPU replicas, routing policies side by side.

    python -m bench.fleet [--adapters 2500] [--replicas 5] [--capacity 16] [--policies random,...]
                          [--swap-json swap.json] [--json PATH] [--plot DIR] [--validate-json FILE]
    python -m bench.fleet --real [--real-replicas 5] [--real-adapters 100] ... [--json PATH] [--plot DIR]

A discrete-event simulation (simpy) of N adapters with Zipf popularity, Poisson arrivals and R replicas
each holding K prepared adapters, with costs from stated sources (bench/fleet_model.py, docs/fleet.md).
For each policy: hit rate, swaps per second, p50/p95 latency against arrival rate, and the highest rate
the replicas hold with p95 within the target (13 s: the reference service's total latency). The last
line is `fleet: adapters=<N> replicas=<R> best_policy=<name> max_rate_at_p95_13s=<req/s>
vs_random=<ratio> hit_rate=<h> sim_vs_ray_hit_rate_gap=<gap or na>`, where hit_rate is the best
policy's at its highest rate and the gap compares a measured Ray Serve run (--validate-json) with the
model on the same scenario. It then prices the best policy's rate: dollars per 1,000 images on A10G, L40S
and H100 (bench/fleet_cost.py: list prices and inference times with their sources).

`--real` runs our router and Ray Serve's multiplexed one on a real local cluster of 5 replicas of the tiny pipeline
instead (about 15 minutes on 2 quiet cores), with the model beside each rate (bench/fleet_real.py). Its inference
is a stand-in: each replica's pipeline call waits the model's inference time, scaled, holding its slot and no core,
because the model assumes one GPU per replica and replicas sharing a machine's cores slow each other
(`--real-cpu-inference` runs it on the CPU instead, for contrast); everything else is real, and the model's
service time includes the per-request overhead outside the replica, measured at the start. The rates bracket the
knees the model predicts. `--real-video-share S` also sends that share of the requests as tiny Wan videos to a pool
of their own (bench/fleet_real_run.py; their stand-in waits `bench.mixed`'s Wan table, scaled, a piece at a time),
and the p95 compared is then the images'. Its last line is `fleet_real: replicas=<R> adapters=<N> video_share=<S>
ours_rate=<req/s> ray_rate=<req/s>
ratio=<ours/ray> hit_ours=<h> hit_ray=<h> sim_gap_ours=<gap> sim_gap_ray=<gap> p95_gap_ours=<gap>
p95_gap_ray=<gap>`: the highest rate whose measured p95 is within the scaled target (interpolated; `na` when no
rate tried was, and then the ratio is `na` too), the hit rates over the rates, the mean gap between measured and
simulated hit rates, and the mean relative gap between the measured p95 at a rate and the model's at that rate
(over the rates where the model's p95 is within twice the target).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/fleet.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence

from bench.fleet_cost import GPUS, gpu_costs
from bench.fleet_model import Costs, RunResult, Scenario
from bench.fleet_policies import POLICIES, make_policy
from bench.fleet_real import RealOptions, ratio_of
from bench.fleet_real_run import measure
from bench.fleet_sweep import Validation, latency_curve, max_rate, validate, validation_spec
from bench.serve import hub_environment
from engine.settings import Settings

__all__ = ["main", "run"]


def _say(text: str) -> None:
    print(text, flush=True)


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    try:
        for name in names:
            make_policy(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if "random" not in names:
        raise argparse.ArgumentTypeError(f"{text!r} lacks random; accepted: a list with random (the baseline)")
    return names


def _fractions(text: str) -> tuple[float, ...]:
    try:
        fractions = tuple(float(f) for f in text.split(",") if f.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}; accepted: comma-separated numbers > 0") from e
    if not fractions or min(fractions) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: comma-separated numbers > 0")
    return fractions


def _swap_from_json(path: Path) -> tuple[float, float]:
    """bench.swap's headline (c) time in seconds and the scale it needs: 1 for a GPU run."""
    try:
        results = json.loads(path.read_text())
        swap_ms, device = float(results["headline"]["swap_ms"]), str(results["options"]["device"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"--swap-json {path}: not a bench.swap JSON file ({e}); accepted: python -m bench.swap --json"
        ) from e
    return swap_ms / 1000, 1.0 if device.startswith("cuda") else Costs.swap_scale


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--adapters", type=int, default=Scenario.adapters, help="adapters in the catalogue (default 2500)")
    add("--replicas", type=int, default=Scenario.replicas, help="GPU replicas (default 5)")
    add("--capacity", type=int, default=Scenario.capacity, help="prepared adapters per replica (default 16)")
    add("--disk-gb", type=float, default=Scenario.disk_gb, help="Hub cache per replica, GB (default 100)")
    add("--zipf", type=float, default=Scenario.zipf, help="Zipf exponent of popularity (default 1.1)")
    add("--warmup", type=int, default=Scenario.warmup, help="requests before measuring (default 12000)")
    add("--requests", type=int, default=Scenario.requests, help="requests measured per run (default 9000)")
    add("--video-share", type=float, default=0.0, help="share of requests that are Wan videos (default 0)")
    add("--inference-s", type=float, default=Costs.inference_s, help="seconds per image (default 8.5, A10G)")
    add("--bandwidth-mbs", type=float, default=Costs.bandwidth_mb_s, help="download MB/s (default 100)")
    add("--swap-ms", type=float, default=Costs.swap_cpu_s * 1000, help="measured swap, ms (default 383, CPU)")
    add("--swap-scale", type=float, help=f"factor on --swap-ms (default {Costs.swap_scale}; 1 for a GPU figure)")
    add("--swap-json", type=Path, help="take the swap time from a bench.swap --json file instead")
    add("--policies", type=_policies, default=POLICIES, help=f"comma-separated (default {','.join(POLICIES)})")
    add("--target-p95", type=float, default=13.0, help="p95 latency target, seconds (default 13)")
    add("--seed", type=int, default=0)
    add("--json", type=Path, dest="json_path", help="write every number to this file")
    add("--plot", type=Path, dest="plot_dir", help="write the JSON and its plots (PNG) into this folder")
    add("--validate-json", type=Path, help="a measured Ray Serve run (see --validation-spec) to compare with")
    add("--validation-spec", action="store_true", help="print the validation scenario as JSON and exit")
    add("--no-cost", action="store_true", help="skip the cost per 1,000 images on A10G, L40S and H100")
    real = RealOptions()
    add("--real", action="store_true", help="both routers on a real local Ray Serve cluster (bench/fleet_real.py)")
    add("--real-replicas", type=int, default=real.replicas, help=f"--real: CPU replicas (default {real.replicas})")
    add("--real-adapters", type=int, default=real.adapters, help=f"--real: LoRAs (default {real.adapters})")
    add("--real-capacity", type=int, default=real.capacity, help=f"--real: sets per replica (default {real.capacity})")
    add("--real-warmup", type=int, default=real.warmup, help=f"--real: warm-up requests (default {real.warmup})")
    add("--real-requests", type=int, default=real.requests, help=f"--real: measured requests (default {real.requests})")
    add("--real-steps", type=int, default=real.steps, help=f"--real: denoising steps (default {real.steps})")
    add("--real-gpu-s", type=float, default=real.gpu_s, help=f"--real: stand-in GPU's wait (default {real.gpu_s} s)")
    add("--real-cpu-inference", action="store_true", help="--real: real CPU inference instead of the stand-in GPU")
    add(
        "--real-video-share",
        type=float,
        default=real.video_share,
        help="--real: the share of requests that are tiny Wan videos on a pool of their own (default: none)",
    )
    add(
        "--real-fractions",
        type=_fractions,
        default=real.fractions,
        help="--real: rates as fractions of saturation (default: around the knees the model predicts)",
    )
    args = parser.parse_args(argv)
    for name in ("adapters", "replicas", "capacity", "requests", "real_replicas", "real_adapters", "real_capacity"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} is too small; accepted: 1 or more")
    for name in ("inference_s", "bandwidth_mbs", "swap_ms", "target_p95", "real_gpu_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not positive; accepted: > 0")
    if args.warmup < 0 or args.disk_gb < 0 or args.zipf < 0:
        parser.error("--warmup, --disk-gb and --zipf must not be negative")
    return args


def scenario_of(args: argparse.Namespace) -> Scenario:
    settings = Settings.from_env(os.environ)
    swap_s, scale = args.swap_ms / 1000, Costs.swap_scale
    if args.swap_json is not None:
        swap_s, scale = _swap_from_json(args.swap_json)
    costs = Costs(
        inference_s=args.inference_s,
        swap_cpu_s=swap_s,
        swap_scale=args.swap_scale if args.swap_scale is not None else scale,
        bandwidth_mb_s=args.bandwidth_mbs,
    )
    return Scenario(
        adapters=args.adapters,
        replicas=args.replicas,
        capacity=args.capacity,
        disk_gb=args.disk_gb,
        zipf=args.zipf,
        warmup=args.warmup,
        requests=args.requests,
        costs=costs,
        video_share=args.video_share,
        # A replica's GPU shared by its pools as the engine's settings say (DEVICE_SHARING, STEP_SHARING_STARVE_STEPS).
        device_sharing=settings.device_sharing,
        starve_steps=settings.step_sharing_starve_steps,
    )


def _row(result: RunResult) -> str:
    return (
        f"  {result.rate:7.3f}  {result.hit_rate:5.3f}  {result.swaps_per_s:8.3f}  {result.downloads_per_s:8.4f}  "
        f"{result.p50_s:7.2f}  {result.p95_s:7.2f}"
        + ("" if math.isnan(result.video_p95_s) else f"  {result.image_p95_s:7.2f}  {result.video_p95_s:7.1f}")
    )


def run(args: argparse.Namespace) -> dict[str, object]:
    began = time.perf_counter()
    scenario, target = scenario_of(args), args.target_p95
    costs = scenario.costs
    _say(
        f"fleet model: {scenario.adapters} adapters (Zipf {scenario.zipf}, {costs.size_min_mb:.0f}-"
        f"{costs.size_max_mb:.0f} MB log-uniform), {scenario.replicas} replicas x {scenario.capacity} prepared, "
        f"{scenario.disk_gb:g} GB disk each; {scenario.warmup} warm-up + {scenario.requests} measured requests per run"
    )
    if scenario.video_share:
        _say(
            f"videos: {scenario.video_share:g} of requests, {costs.video_pieces} x {costs.video_piece_s} s + "
            f"{costs.video_decode_pieces} x {costs.video_decode_s} s; the GPU shared by DEVICE_SHARING="
            f"{scenario.device_sharing} (starve bound {scenario.starve_steps:g} steps); the target is the images' p95"
        )
    _say(
        f"costs: inference {costs.inference_s} s, swap {costs.swap_s * 1000:.1f} ms ({costs.swap_cpu_s * 1000:.0f} ms "
        f"x {costs.swap_scale:g}), prepare {costs.prepare_base_s * 1000:.0f} ms + {costs.prepare_s_per_mb * 1000:.1f} "
        f"ms/MB, download {costs.bandwidth_mb_s:g} MB/s; saturation {scenario.saturation_rate:.3f} req/s"
    )
    policies: dict[str, dict[str, object]] = {}
    found = {}
    for name in args.policies:
        started = time.perf_counter()
        curve = latency_curve(scenario, name, args.seed)
        best = max_rate(scenario, name, curve, target, args.seed)
        found[name] = best
        _say(f"\n{name} ({time.perf_counter() - started:.0f} s)")
        by_kind = "  image p95  video p95" if scenario.video_share else ""
        _say(f"     rate    hit  swaps/s  downl./s  p50 (s)  p95 (s){by_kind}")
        for result in curve:
            _say(_row(result))
        if best.at_rate is not None:
            _say(f"{_row(best.at_rate)}   <- highest rate with p95 <= {target:g} s")
        policies[name] = {
            "curve": [dataclasses.asdict(r) for r in curve],
            "max_rate": best.rate,
            "at_max_rate": None if best.at_rate is None else dataclasses.asdict(best.at_rate),
        }
    winner = max(args.policies, key=lambda n: found[n].rate)
    baseline = found["random"].rate
    vs_random = found[winner].rate / baseline if baseline > 0 else None
    best_name = winner if found[winner].rate > 0 else "none"  # no policy met the target at any rate tried
    validation: Validation | None = validate(args.validate_json, _say) if args.validate_json is not None else None
    at_best = found[winner].at_rate
    _say(f"\nhighest rate with p95 <= {target:g} s, {scenario.replicas} replicas:")
    for name in args.policies:
        edge = found[name].at_rate
        hit = f"hit rate {edge.hit_rate:.3f}, {edge.swaps_per_s:.3f} swaps/s" if edge else "never within target"
        _say(f"  {name:<20} {found[name].rate:7.3f} req/s  ({hit})")
    if validation is not None:
        _say(
            f"validation: measured hit rate {validation.measured_hit_rate:.3f}, simulated "
            f"{validation.simulated_hit_rate:.3f}, gap {validation.gap:.3f}"
        )
    gpu = []
    if not args.no_cost and best_name != "none":
        _say(f"\ncost per 1,000 images within p95 <= {target:g} s, {scenario.replicas} replicas, {best_name}:")
        gpu = [dataclasses.asdict(c) for c in gpu_costs(scenario, best_name, target, args.seed, _say)]
    line = (
        f"fleet: adapters={scenario.adapters} replicas={scenario.replicas} best_policy={best_name} "
        f"max_rate_at_p95_{target:g}s={found[winner].rate:.3f} "
        f"vs_random={'na' if vs_random is None else f'{vs_random:.2f}'} "
        f"hit_rate={'na' if at_best is None else f'{at_best.hit_rate:.3f}'} "
        f"sim_vs_ray_hit_rate_gap={'na' if validation is None else f'{validation.gap:.3f}'}"
    )
    results: dict[str, object] = {
        "benchmark": "fleet",
        "scenario": dataclasses.asdict(scenario),
        "saturation_rate": scenario.saturation_rate,
        "target_p95_s": target,
        "seed": args.seed,
        "policies": policies,
        "best_policy": best_name,
        "vs_random": vs_random,
        "validation": None if validation is None else {**dataclasses.asdict(validation), "gap": validation.gap},
        "validation_spec": validation_spec(),
        "cost": {"gpus": [dataclasses.asdict(g) for g in GPUS], "per_gpu": gpu},
        "wall_s": round(time.perf_counter() - began, 1),
        "final_line": line,
    }
    _say(f"the whole run took {results['wall_s']:.0f} s")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(results, indent=2))
        _say(f"wrote {args.json_path}")
    if args.plot_dir is not None:
        from bench.plots import save_with_plots  # matplotlib only when plots are asked for

        for path in save_with_plots(results, args.plot_dir, "fleet"):
            _say(f"wrote {path}")
    _say(line)
    return results


def run_real(args: argparse.Namespace) -> dict[str, object]:
    """`--real`: the cluster run of bench/fleet_real.py, its report and its last line."""
    options = RealOptions(
        replicas=args.real_replicas,
        adapters=args.real_adapters,
        capacity=args.real_capacity,
        warmup=args.real_warmup,
        requests=args.real_requests,
        steps=args.real_steps,
        fractions=args.real_fractions,
        seed=args.seed,
        gpu_s=0.0 if args.real_cpu_inference else args.real_gpu_s,
        video_share=args.real_video_share,
    )
    root = Path(tempfile.mkdtemp(prefix="fleet-real-"))
    try:
        hub_port = hub_environment(root)  # before anything imports huggingface_hub
        results = measure(options, root, hub_port, _say)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    routers = results["routers"]
    ours, ray = routers["ours"], routers["ray_multiplexed"]  # type: ignore[index]
    ratio, kind = ratio_of(ours, ray)
    _say(f"\nrate held at p95 <= {results['target_p95_s']:.2f} s (13 s scaled by k={results['k']:.4f}):")
    for name, summary in routers.items():  # type: ignore[attr-defined]
        _say(
            f"  {name:<16} {_rate(summary)} ({summary['found']}; the model "
            f"{summary['model_rate_at_target']:.3f}), hit rate "
            f"{summary['hit_rate']:.3f}, model gaps {[round(g, 3) for g in summary['sim_gaps']]}, "
            f"p95 measured/model {[round(r, 2) for r in summary['p95_measured_over_model']]} "
            f"(gap {summary['p95_gap']:.3f})"
        )
    _say(f"ratio: {kind}" if ratio is None else f"ratio {ratio:.2f}: {kind}")
    line = (
        f"fleet_real: replicas={options.replicas} adapters={options.adapters} video_share={options.video_share} "
        f"ours_rate={_rate(ours, bare=True)} ray_rate={_rate(ray, bare=True)} "
        f"ratio={'na' if ratio is None else f'{ratio:.2f}'} hit_ours={ours['hit_rate']:.3f} "
        f"hit_ray={ray['hit_rate']:.3f} sim_gap_ours={ours['sim_gap']:.3f} sim_gap_ray={ray['sim_gap']:.3f} "
        f"p95_gap_ours={ours['p95_gap']:.3f} p95_gap_ray={ray['p95_gap']:.3f}"
    )
    results = {**results, "ratio": ratio, "ratio_kind": kind, "final_line": line}
    _say(f"the whole run took {results['wall_s']:.0f} s")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(results, indent=2))
        _say(f"wrote {args.json_path}")
    if args.plot_dir is not None:
        from bench.plots import save_with_plots

        for path in save_with_plots(results, args.plot_dir, "fleet-real"):
            _say(f"wrote {path}")
    _say(line)
    return results


def _rate(summary: dict, bare: bool = False) -> str:
    """A router's rate at the target; `na` when no rate tried was within it (its rate is below the lowest)."""
    if summary["found"] == "none":
        return "na" if bare else "na (p95 above the target at every rate tried)"
    return f"{summary['rate_at_target']:.3f}" if bare else f"{summary['rate_at_target']:.3f} req/s"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.validation_spec:
        print(json.dumps(validation_spec(), indent=2))
        return 0
    try:
        if args.real:
            run_real(args)
            return 0
        run(args)
    except ValueError as e:
        raise SystemExit(f"bench.fleet: {e}") from e
    return 0


if __name__ == "__main__":
    sys.exit(main())
