"""`python -m bench.serve`: the launched service under load, today's FIFO beside the scheduler, in one run.

The service is the real app (UI, named API and `POST /` on one port) over the tiny random-weight pipeline,
with its LoRAs on the stand-in Hub (tests/support). Each LoRA is a small real file, but its download takes
what an SDXL LoRA of its drawn size would take over the given link: sizes log-uniform over 20–900 MB
(rank-4 to rank-128 SDXL LoRAs), delay = size / `--bandwidth-mb-s`. The most popular `--warm` LoRAs are in
the cache before the clock starts; the rest are cold on first use.

`--clients` closed-loop clients (a quarter through `gradio_client`, the rest `POST /`) each send
`--requests` requests for LoRAs drawn with Zipf(`--zipf`) popularity over `--adapters` LoRAs, pausing
`--think-s` on average before each (exponential; 0: none, the harshest load). Both modes replay the same
draws against their own copy of the LoRAs (so both start equally cold):

- `fifo_inline`: the behaviour before the scheduler (strict FIFO, preparation inside the GPU slot);
- `affinity`: the scheduler (preparation on its pool ahead of the slot; affinity under AFFINITY_MAX_SKIP).

Measured per mode: p50/p95 latency (client side), GPU-busy fraction (swap and inference time over the time
work was queued for the GPU: some request ready to run was waiting or running; "busy any" divides by the time
any request was in the service, downloads included), swaps per request and the most overtakes any request
saw. The last line is the scheduler's:
`serve_p95_vs_fifo=<new/old> gpu_busy=<fraction> swaps_per_request=<n> max_overtakes=<n>`.
`--json FILE` keeps every request's timings; `--plot DIR` writes that JSON as DIR/serve.json and draws
the latency distribution per mode from it (bench.plots).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.serve_model import MODES, ModeResult, Options


def parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, default=120, help="LoRAs on the stand-in Hub (>= 100)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients (>= 8)")
    parser.add_argument("--requests", type=int, default=10, help="requests per client")
    parser.add_argument("--warm", type=int, default=24, help="most popular LoRAs cached before the clock starts")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of LoRA popularity")
    parser.add_argument("--bandwidth-mb-s", type=float, default=100.0, help="the simulated Hub link, MB/s")
    parser.add_argument("--steps", type=int, default=1, help="inference steps per request (tiny pipeline)")
    parser.add_argument(
        "--think-s", type=float, default=3.0, help="mean pause between a client's requests (exponential; 0: none)"
    )
    parser.add_argument("--max-skip", type=int, default=3, help="AFFINITY_MAX_SKIP for the scheduler")
    parser.add_argument("--workers", type=int, default=2, help="PREPARE_WORKERS for the scheduler")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write every request's timings here")
    parser.add_argument(
        "--plot", type=Path, default=None, dest="plot_dir", help="write the JSON and its latency plot here"
    )
    a = parser.parse_args(argv)
    if a.adapters < 1 or a.clients < 1 or a.requests < 1 or not 0 <= a.warm <= a.adapters:
        parser.error("--adapters, --clients and --requests must be positive and --warm within --adapters")
    return Options(
        a.adapters,
        a.clients,
        a.requests,
        a.warm,
        a.zipf,
        a.bandwidth_mb_s,
        a.steps,
        a.think_s,
        a.max_skip,
        a.workers,
        a.seed,
        a.json,
        a.plot_dir,
    )


def hub_environment(root: Path) -> int:
    """Point huggingface_hub at a stand-in Hub before anything imports it; returns the Hub's port."""
    from tests.support.app_server import free_port

    port = free_port()
    os.environ.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HOME=str(root / "hf-home"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        # A 900 MB LoRA over a slow link takes long before its first byte arrives here.
        HF_HUB_DOWNLOAD_TIMEOUT="120",
        HF_HUB_ETAG_TIMEOUT="30",
        GRADIO_ANALYTICS_ENABLED="False",
    )
    return port


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    port = hub_environment(root)
    from bench.serve_run import Bench

    bench = Bench(options, root, port)
    try:
        results = [bench.run(mode) for mode in MODES]
    finally:
        bench.close()
    report(options, results)
    return 0


def report(options: Options, results: Sequence[ModeResult]) -> None:
    old, new = results
    print(
        f"\n{options.clients} clients x {options.requests} requests, {options.adapters} LoRAs, Zipf({options.zipf}), "
        f"{options.warm} warm, link {options.bandwidth_mb_s:g} MB/s, {options.steps} step(s), "
        f"think {options.think_s:g} s; "
        f"AFFINITY_MAX_SKIP={options.max_skip}, PREPARE_WORKERS={options.workers}"
    )
    columns = ("ok", "p50 s", "p95 s", "gpu busy", "busy any", "swaps/req", "overtakes", "wall s")
    print(f"{'mode':<12}" + "".join(f" {c:>9}" for c in columns))
    for r in results:
        ok = sum(1 for s in r.samples if s.ok)
        print(
            f"{r.mode:<12} {ok:>9} {r.percentile(0.5):>9.2f} {r.percentile(0.95):>9.2f} {r.gpu_busy:>9.2f} "
            f"{r.gpu_busy_any:>9.2f} {r.swaps_per_request:>9.2f} {r.max_overtakes:>9d} {r.wall_s:>9.1f}"
        )
    failed = [s for r in results for s in r.samples if not s.ok]
    for sample in failed[:5]:
        print(f"failed: {sample.mode} client {sample.client} LoRA {sample.adapter}: {sample.error}", file=sys.stderr)
    if options.json_path is not None or options.plot_dir is not None:
        document: dict[str, Any] = {
            # What bench.plots reads: the client-side latency of every request that succeeded, per mode.
            "benchmark": "serve",
            "title": (
                f"Serving latency: {options.clients} clients, {options.adapters} LoRAs, Zipf({options.zipf}), "
                f"link {options.bandwidth_mb_s:g} MB/s"
            ),
            "latencies_s": {r.mode: [s.latency for s in r.samples if s.ok] for r in results},
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
            "modes": {
                r.mode: {
                    "requests": [asdict(s) | {"latency": s.latency} for s in r.samples],
                    "runs": [{"start": a, "end": b, "swapped": c} for a, b, c in r.runs],
                    "runnable": [{"start": a, "end": b} for a, b in r.runnable],
                    "max_overtakes": r.max_overtakes,
                }
                for r in results
            },
        }
        if options.json_path is not None:
            options.json_path.write_text(json.dumps(document, indent=1))
        if options.plot_dir is not None:
            from bench.plots import save_with_plots

            for path in save_with_plots(document, options.plot_dir, "serve"):
                print(f"wrote {path}")
    print(
        f"serve_p95_vs_fifo={new.percentile(0.95) / old.percentile(0.95):.2f} gpu_busy={new.gpu_busy:.2f} "
        f"swaps_per_request={new.swaps_per_request:.2f} max_overtakes={new.max_overtakes}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
