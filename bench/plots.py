"""PNG plots drawn from the benchmarks' JSON results, never by hand.

    python -m bench.plots RESULTS.json... --out DIR

Knows bench.swap's JSON (swap time against rank: ours, the floor, diffusers' hotswap and the reference
cycle), bench.fleet's (latency and hit rate against arrival rate per policy; with --real, measured on a
cluster beside the model) and a serving benchmark's
(`{"benchmark": "serve", "latencies_s": {mode: [seconds, ...]}}`: the latency distribution per mode).
A benchmark's `--plot DIR` writes its JSON into DIR and then draws the plots from that file.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/plots.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

# A benchmark's JSON, as json.loads gives it back.
Results = Mapping[str, Any]

__all__ = [
    "fleet_latency_plot",
    "fleet_real_plot",
    "fleet_series",
    "main",
    "plot_json",
    "save_with_plots",
    "serve_latency_plot",
    "swap_rank_plot",
    "swap_series",
]

# bench.swap's method labels (bench/sections.py, bench/report.py) and how the plot names them.
SWAP_METHODS = {
    "(a) reference cycle": "(a) reference cycle: load + fuse + unfuse + unload",
    "(b) diffusers hotswap": "(b) diffusers hotswap (unfused)",
    "(c) ours, cached adapter": "(c) ours, cached adapter",
    "(e) floor: fastest exact kernel": "(e) floor: fastest exact kernel (ΔW in fp32, rounded once)",
}
_FORMAT_STYLES = {"peft": "-", "kohya": "--"}
_DPI = 120


def swap_series(results: Results) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Median milliseconds by method, then file format, as (rank, ms) sorted by rank."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for row in results["rows"]:
        if row["method"] in SWAP_METHODS:
            series.setdefault(row["method"], {}).setdefault(row["fmt"], []).append((row["rank"], row["median_ms"]))
    return {method: {fmt: sorted(points) for fmt, points in by_fmt.items()} for method, by_fmt in series.items()}


def swap_rank_plot(results: Results, path: Path) -> Path:
    options = results.get("options", {})
    environment = results.get("environment", {})
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    axes = figure.subplots()
    for index, (method, by_fmt) in enumerate(sorted(swap_series(results).items())):
        for fmt, points in by_fmt.items():
            label = f"{SWAP_METHODS[method]}, {fmt}"
            axes.plot(
                [rank for rank, _ in points],
                [ms for _, ms in points],
                _FORMAT_STYLES.get(fmt, ":"),
                marker="o",
                color=f"C{index}",
                label=label,
            )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    ranks = sorted({row["rank"] for row in results["rows"]})
    axes.set_xticks(ranks, [str(r) for r in ranks])
    axes.set_xlabel("LoRA rank")
    axes.set_ylabel("median time per swap (ms, log scale)")
    where = environment.get("gpu") or f"{environment.get('cpus', '?')}-CPU machine"
    axes.set_title(f"Changing the served LoRA: {options.get('dtype', '?')} on {where}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=_DPI)
    return path


def fleet_series(results: Results) -> dict[str, list[tuple[float, float, float, float]]]:
    """Per policy: (rate, p50, p95, hit rate) along its latency curve, sorted by rate."""
    policies: Mapping[str, Results] = results["policies"]
    return {
        name: sorted((r["rate"], r["p50_s"], r["p95_s"], r["hit_rate"]) for r in data["curve"])
        for name, data in policies.items()
    }


def fleet_latency_plot(results: Results, path: Path) -> Path:
    scenario = results["scenario"]
    target = float(results["target_p95_s"])
    figure = Figure(figsize=(11, 4.6), layout="constrained")
    latency, hits = figure.subplots(1, 2, width_ratios=(3, 2))
    for index, (name, points) in enumerate(fleet_series(results).items()):
        rates, p50, p95, hit = zip(*points, strict=True)
        color = f"C{index}"
        latency.plot(rates, p95, "-", marker="o", color=color, label=f"{name} p95")
        latency.plot(rates, p50, ":", marker=".", color=color, label=f"{name} p50")
        hits.plot(rates, hit, "-", marker="o", color=color, label=name)
        edge = results["policies"][name].get("at_max_rate")
        if edge is not None:  # the highest rate found within the target
            latency.plot([edge["rate"]], [edge["p95_s"]], marker="*", markersize=14, color=color, linestyle="none")
    latency.axhline(target, color="black", linewidth=1, label=f"p95 target {target:g} s")
    latency.axvline(float(results["saturation_rate"]), color="grey", linewidth=1, linestyle="--")
    latency.set_yscale("log")
    latency.set_xlabel("arrival rate (requests/s); star: highest rate within the target; dashed: all GPUs busy")
    latency.set_ylabel("latency (s, log scale)")
    latency.set_title(
        f"{scenario['adapters']} LoRAs (Zipf {scenario['zipf']}) on {scenario['replicas']} replicas "
        f"x {scenario['capacity']} prepared"
    )
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="x-small", ncol=2)
    hits.set_xlabel("arrival rate (requests/s)")
    hits.set_ylabel("hit rate (adapter already prepared)")
    hits.set_ylim(0, 1)
    hits.grid(True, alpha=0.3)
    hits.legend(fontsize="x-small")
    figure.savefig(path, dpi=_DPI)
    return path


def fleet_real_plot(results: Results, path: Path) -> Path:
    """bench.fleet --real: each router's measured p95 and hit rate against the rate (markers), the fleet model's
    on the same scenario (lines), the scaled p95 target, and the rate each router holds at it (stars)."""
    target = float(results["target_p95_s"])
    options = results["options"]
    figure = Figure(figsize=(11, 4.6), layout="constrained")
    latency, hits = figure.subplots(1, 2, width_ratios=(3, 2))
    for index, (router, summary) in enumerate(results["routers"].items()):
        color = f"C{index}"
        # With the p95's 95 % interval where the run recorded it (bench.fleet_real.p95_interval; older files: none).
        measured = sorted(
            (
                r["measured"]["rate"],
                r["measured"]["p95_s"],
                r["measured"]["hit_rate"],
                r["measured"].get("p95_low_s", r["measured"]["p95_s"]),
                r["measured"].get("p95_high_s", r["measured"]["p95_s"]),
            )
            for r in results["runs"]
            if r["measured"]["router"] == router and r["measured"]["rate"] is not None
        )
        model = sorted((r["rate"], r["p95_s"], r["hit_rate"]) for r in summary["model_curve"])
        latency.plot([m[0] for m in model], [m[1] for m in model], "--", color=color, label=f"{router}: model p95")
        latency.errorbar(
            [m[0] for m in measured],
            [m[1] for m in measured],
            yerr=[[m[1] - m[3] for m in measured], [m[4] - m[1] for m in measured]],
            fmt="o",
            capsize=3,
            color=color,
            label=f"{router}: measured (95 % interval)",
        )
        hits.plot([m[0] for m in model], [m[2] for m in model], "--", color=color, label=f"{router}: model")
        hits.plot([m[0] for m in measured], [m[2] for m in measured], "o", color=color, label=f"{router}: measured")
        if summary["rate_at_target"]:
            latency.plot([summary["rate_at_target"]], [target], marker="*", markersize=14, color=color)
    latency.axhline(target, color="black", linewidth=1, label=f"p95 target {target:.2f} s (13 s scaled)")
    latency.set_yscale("log")
    latency.set_xlabel("arrival rate (requests/s); star: the rate held at the target, interpolated")
    latency.set_ylabel("p95 latency (s, log scale)")
    # Older runs' files have no `gpu_s`: their inference ran on the CPU.
    inference = f"stand-in GPU, {options['gpu_s']:g} s" if options.get("gpu_s") else "CPU inference"
    latency.set_title(
        f"Ray Serve: {options['adapters']} LoRAs, {options['replicas']} replicas x {options['capacity']} sets, "
        f"tiny pipeline, {inference}"
    )
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="x-small", ncol=2)
    hits.set_xlabel("arrival rate (requests/s)")
    hits.set_ylabel("hit rate (adapter already prepared)")
    hits.set_ylim(0, 1)
    hits.grid(True, alpha=0.3)
    hits.legend(fontsize="x-small")
    figure.savefig(path, dpi=_DPI)
    return path


def serve_latency_plot(latencies_s: Mapping[str, Sequence[float]], path: Path, title: str = "") -> Path:
    """The serving benchmark's hook: each mode's latency distribution as an empirical CDF."""
    if not latencies_s or any(not samples for samples in latencies_s.values()):
        raise ValueError(
            "every mode needs at least one latency; got " + repr({k: len(v) for k, v in latencies_s.items()})
        )
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for mode, samples in latencies_s.items():
        ordered = sorted(samples)
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        axes.step(ordered, fractions, where="post", label=f"{mode} (n={len(ordered)})")
    axes.set_xlabel("latency (s)")
    axes.set_ylabel("fraction of requests")
    axes.set_ylim(0, 1)
    axes.set_title(title or "Serving latency distribution")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=_DPI)
    return path


def plot_json(json_path: Path, out_dir: Path) -> list[Path]:
    """Draw every plot that one results file holds; the file names follow its stem."""
    results = json.loads(json_path.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = json_path.stem
    kind = results.get("benchmark") if isinstance(results, dict) else None
    if kind == "fleet":
        return [fleet_latency_plot(results, out_dir / f"{stem}-latency.png")]
    if kind == "fleet_real":
        return [fleet_real_plot(results, out_dir / f"{stem}-latency.png")]
    if kind == "serve":
        return [serve_latency_plot(results["latencies_s"], out_dir / f"{stem}-latency.png", results.get("title", ""))]
    if kind is None and isinstance(results, dict) and {"rows", "headline"} <= set(results):  # bench.swap's JSON
        return [swap_rank_plot(results, out_dir / f"{stem}-by-rank.png")]
    raise ValueError(
        f"{json_path} is not a result this module knows; accepted: bench.swap, bench.fleet (--real) or serve JSON"
    )


def save_with_plots(results: Results, out_dir: Path, stem: str) -> list[Path]:
    """Write `results` as DIR/<stem>.json, then draw its plots from that file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=2))
    return [json_path, *plot_json(json_path, out_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="JSON files written by the benchmarks")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    args = parser.parse_args(argv)
    for json_path in args.results:
        try:
            written = plot_json(json_path, args.out)
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"bench.plots: {json_path}: {e}") from e
        for path in written:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
