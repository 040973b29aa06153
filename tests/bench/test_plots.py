"""Plots drawn from the benchmarks' own JSON: a short swap run on the tiny UNet, a small fleet run, a serve hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import fleet, plots
from bench.measure import Clock
from bench.options import Options
from bench.ours import write_pair
from bench.report import Exactness, report
from bench.sdxl_unet import build_sdxl_unet, random_pool
from bench.sections import measure_ours, measure_reference
from engine.families.sdxl import build_tiny_pipeline
from serving.demo.synthetic import UNET_ATTENTION, find_targets

CPU = torch.device("cpu")
PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


@pytest.fixture(scope="module")
def swap_json(tmp_path_factory) -> Path:
    """bench.swap's JSON from a short run on the tiny UNet: two ranks, PEFT files, --plot asked for."""
    folder = tmp_path_factory.mktemp("swap")
    unet = build_sdxl_unet(
        dtype=torch.bfloat16, pool=random_pool(seed=3, size=1 << 18), config=dict(build_tiny_pipeline().unet.config)
    )
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    options = Options(
        device=CPU,
        dtype=torch.bfloat16,
        ranks=(4, 8),
        formats=("peft",),
        repeats=2,
        reference_repeats=1,
        leak_swaps=0,
        threads=None,
        quick=True,
        json_path=None,
        workdir=None,
        plot_dir=folder / "plots",
    )
    pairs = {(r, f): write_pair(folder, targets, rank=r, fmt=f) for r in options.ranks for f in options.formats}
    ours = measure_ours(unet, pairs, options, Clock(CPU), say=lambda _: None)
    reference = measure_reference(unet, pairs, options, Clock(CPU), say=lambda _: None)
    exactness = Exactness(True, 0, 0.0, 0, reference.cycles)
    report(options, {"cpus": 2, "gpu": None}, ours, reference, exactness, say=lambda _: None)
    return folder / "plots" / "swap.json"


def test_swap_plot_is_written_by_the_benchmark_from_its_json(swap_json):
    assert is_png(swap_json.with_name("swap-by-rank.png"))
    results = json.loads(swap_json.read_text())
    series = plots.swap_series(results)
    assert set(series) == set(plots.SWAP_METHODS)
    for method, by_fmt in series.items():
        assert set(by_fmt) == {"peft"}
        for fmt, points in by_fmt.items():
            rows = [r for r in results["rows"] if r["method"] == method and r["fmt"] == fmt]
            assert points == sorted((r["rank"], r["median_ms"]) for r in rows)
            assert [rank for rank, _ in points] == [4, 8]


def test_plots_cli_redraws_swap_and_fleet_json(swap_json, tmp_path, capsys):
    fleet_dir = tmp_path / "fleet"
    argv = ["--adapters", "30", "--replicas", "2", "--capacity", "3", "--warmup", "50", "--requests", "200"]
    assert fleet.main([*argv, "--policies", "random,least_finish", "--plot", str(fleet_dir)]) == 0
    assert is_png(fleet_dir / "fleet-latency.png")
    results = json.loads((fleet_dir / "fleet.json").read_text())
    series = plots.fleet_series(results)
    assert list(series) == ["random", "least_finish"]
    assert [p[0] for p in series["random"]] == [r["rate"] for r in results["policies"]["random"]["curve"]]
    out = tmp_path / "again"
    assert plots.main([str(swap_json), str(fleet_dir / "fleet.json"), "--out", str(out)]) == 0
    assert is_png(out / "swap-by-rank.png") and is_png(out / "fleet-latency.png")
    assert f"wrote {out / 'fleet-latency.png'}" in capsys.readouterr().out


def test_serve_latency_hook(tmp_path):
    latencies = {"local": [8.6, 8.7, 9.1, 12.0], "cluster": [8.9, 9.0, 9.5, 10.2, 14.1]}
    assert is_png(plots.serve_latency_plot(latencies, tmp_path / "direct.png", title="two modes"))
    (tmp_path / "serve.json").write_text(json.dumps({"benchmark": "serve", "latencies_s": latencies}))
    assert plots.plot_json(tmp_path / "serve.json", tmp_path) == [tmp_path / "serve-latency.png"]
    assert is_png(tmp_path / "serve-latency.png")
    with pytest.raises(ValueError, match="every mode needs at least one latency"):
        plots.serve_latency_plot({"local": []}, tmp_path / "empty.png")


def test_an_unknown_json_is_refused_by_name(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    accepted = r"accepted: bench\.swap, bench\.fleet \(--real\) or serve JSON"
    with pytest.raises(SystemExit, match=rf"other\.json: .* {accepted}"):
        plots.main([str(tmp_path / "other.json"), "--out", str(tmp_path)])
