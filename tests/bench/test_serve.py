"""bench.serve's arithmetic on known intervals, and (slow) one small run that ends with its summary line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serve_model import ModeResult, Options, Sample, _union, draws, sizes_mb
from engine.requests import GenerateRequest, LoraSpec
from tests.support.loras import WEIGHTS, card, peft_file

REPO = Path(__file__).resolve().parents[2]


def sample(sent: float, done: float, ok: bool = True) -> Sample:
    return Sample("affinity", 0, "post", 0, sent, done, ok, "")


def test_busy_time_is_the_union_of_runs_over_the_time_work_was_present():
    assert _union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)
    result = ModeResult(
        "affinity",
        (sample(0, 4), sample(1, 5), sample(8, 10), sample(9, 9.5, ok=False)),
        ((0.5, 2.5, True), (2.5, 4.5, False), (8.5, 9.5, True)),
        runnable=((0.5, 4.5), (8.2, 9.5)),
        max_overtakes=2,
        wall_s=10,
    )
    # Work present over [0, 5] and [8, 10] = 7 s; runnable over 4 + 1.3 s; runs cover 4 + 1 = 5 s.
    assert result.gpu_busy_any == pytest.approx(5 / 7)
    assert result.gpu_busy == pytest.approx(5 / 5.3)
    assert result.swaps_per_request == pytest.approx(2 / 3)
    assert result.latencies == [2.0, 4.0, 4.0]
    assert result.percentile(0.5) == 4.0 and result.percentile(0.95) == 4.0


def test_both_modes_replay_the_same_zipf_draws_and_sizes():
    options = Options(120, 8, 50, 24, 1.1, 100.0, 1, 3.0, 3, 2, 0, None)
    plan = draws(options)
    assert plan == draws(options) and len(plan) == 8 and all(len(p) == 50 for p in plan)
    picks = [index for client in plan for index, _ in client]
    # Zipf(1.1): the most popular LoRA is drawn far more often than one in the tail.
    assert picks.count(0) > 5 * max(1, picks.count(100))
    assert all(20 <= size <= 900 for size in sizes_mb(options))


def test_the_warm_up_caches_more_loras_than_the_prefetch_lane_holds(make_engine, loaded, hub):
    """Regression: the warm-up went through the bounded prefetch lane, which drops its oldest past MAX_QUEUE
    waiting, so `bench.serve`'s default run (24 warm, a queue of 16) stopped in its warm-up (EngineBusyError)."""
    from bench.serve_run import warm_cache

    engine = make_engine(max_queue=1)
    specs = [LoraSpec(f"bench-warm/lora-{index}") for index in range(3)]
    for index, spec in enumerate(specs):
        hub.add_repo(spec.ref, {"README.md": card(), WEIGHTS: peft_file(loaded.pipe, seed=500 + index)}, tags=["lora"])
    warm_cache(engine, specs)
    for spec in specs:
        with engine.prepare(GenerateRequest(prompt="after the warm-up", loras=(spec,))) as prepared:
            assert [use.cache for use in prepared.uses] == ["hit"]


@pytest.mark.slow
def test_a_small_run_ends_with_the_summary_line(tmp_path):
    out = tmp_path / "serve.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.serve",
            # More warm LoRAs than the queue's 16 (max(16, 2 x clients)): the warm-up once went through the
            # bounded prefetch lane and was dropped past 16.
            "--adapters",
            "18",
            "--clients",
            "3",
            "--requests",
            "2",
            "--warm",
            "17",
            "--bandwidth-mb-s",
            "900",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "plots"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        r"serve_p95_vs_fifo=([\d.]+) gpu_busy=([\d.]+) swaps_per_request=([\d.]+) max_overtakes=(\d+)", last
    )
    assert found, done.stdout[-2000:]
    ratio, busy, swaps, overtakes = (float(value) for value in found.groups())
    assert ratio > 0 and 0 < busy <= 1 and 0 <= swaps <= 1 and overtakes >= 0, last
    assert "failed:" not in done.stderr, done.stderr[-2000:]
    assert out.is_file()
    # The plot is drawn from the JSON the run wrote into the plot folder (bench.plots), one line per mode.
    written = json.loads((tmp_path / "plots" / "serve.json").read_text())
    assert set(written["latencies_s"]) == {"fifo_inline", "affinity"}
    assert (tmp_path / "plots" / "serve-latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
