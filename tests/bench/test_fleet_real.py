"""bench.fleet --real's arithmetic without a cluster (the cluster run itself needs Ray: docs/fleet.md), and the
fleet model's cost per 1,000 images."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from scipy.stats import binom

from bench import plots
from bench.fleet_cost import GPUS, gpu_costs
from bench.fleet_model import Costs, Scenario, simulate, simulate_phases
from bench.fleet_policies import make_policy
from bench.fleet_real import (
    POLICY_OF,
    RealOptions,
    RealRun,
    Sample,
    _compare,
    p95_interval,
    rate_at_target,
    rates_around,
    ratio_of,
    scaled_costs,
    scaled_scenario,
    summarise,
    video_waits,
)
from bench.mixed import WAN_A10G, WAN_STEP_S
from tests.bench.test_plots import is_png

SMALL = RealOptions(replicas=2, adapters=40, capacity=3, warmup=40, requests=120, clients=2)


def test_the_rate_at_the_target_is_interpolated_between_the_rates_measured():
    assert rate_at_target([(1.0, 0.5), (2.0, 0.7), (3.0, 1.1)], 0.9) == (pytest.approx(2.5), "interpolated")
    assert rate_at_target([(2.0, 0.7), (1.0, 0.5)], 0.9) == (2.0, "lower bound")
    assert rate_at_target([(1.0, 1.5), (2.0, 2.0)], 0.9) == (0.0, "none")


def test_a_router_within_the_target_at_no_rate_has_no_rate_and_no_ratio():
    # Regression: the published run printed ours_rate=0.000 ratio=0.00 when ours met the target at no rate tried.
    ours, ray = {"rate_at_target": 0.0, "found": "none"}, {"rate_at_target": 1.118, "found": "interpolated"}
    assert ratio_of(ours, ray) == (None, "not measured: ours within the target at no rate tried")
    assert ratio_of({"rate_at_target": 3.0, "found": "interpolated"}, ray) == (pytest.approx(3.0 / 1.118), "measured")
    # Within the target at every rate tried: a lower bound of that router's rate, and so of the ratio or its inverse.
    assert ratio_of({"rate_at_target": 3.0, "found": "lower bound"}, ray)[1] == "lower bound"
    assert ratio_of({"rate_at_target": 3.0, "found": "interpolated"}, {**ray, "found": "lower bound"})[1] == (
        "upper bound"
    )
    both = {"rate_at_target": 3.0, "found": "lower bound"}
    assert ratio_of(both, both)[0] is None


def test_the_p95_interval_holds_the_true_p95_with_95_percent_confidence():
    for n, p95_rank in ((150, 143), (200, 190)):
        low, high = p95_interval(n)
        assert low < p95_rank < high  # the nearest-rank p95
        # The number of latencies below the true p95 is Binomial(n, 0.95): the interval's ranks catch it 95 % of times.
        assert binom.cdf(high - 1, n, 0.95) - binom.cdf(low - 1, n, 0.95) >= 0.95
    assert p95_interval(150) == (137, 148)


def test_the_rates_bracket_the_knees_the_model_predicts():
    assert rates_around({"ours": 4.0, "ray_multiplexed": 1.0}, saturation=9.0) == [0.9, 2.0, 5.0]
    # Close knees: each bracketed all the same.
    assert rates_around({"ours": 2.0, "ray_multiplexed": 2.0}, saturation=9.0) == [1.5, 2.0, 2.5]
    # The model finds no rate for a router: the other's knee is bracketed; no rate under a tenth of saturation.
    # Regression: a run whose model found no rate for Serve's router measured only around ours' knee.
    assert rates_around({"ours": 2.0, "ray_multiplexed": 0.0}, saturation=9.0) == [0.9, 1.342, 2.5]
    assert rates_around({"ours": 4.0, "ray_multiplexed": 1.0}, saturation=20.0) == [2.0, 2.828, 5.0]
    assert rates_around({"ours": 0.0, "ray_multiplexed": 0.0}, saturation=10.0) == [1.0, 1.25]


def test_the_tiny_model_stands_for_sdxl_scaled_in_time():
    costs = scaled_costs(inference_s=0.425, swap_s=0.004, prepare_s=0.03)
    k = 0.425 / Costs.inference_s
    # A 231 MB file takes 2.31 s at 100 MB/s for SDXL's 8.5 s image; k of that for the tiny one.
    assert costs.download_s(231.0) == pytest.approx(2.31 * k)
    assert (costs.swap_s, costs.prepare_s(900.0)) == (pytest.approx(0.004), pytest.approx(0.03))
    scenario = scaled_scenario(SMALL, costs, phases=3)
    assert (scenario.replicas, scenario.adapters, scenario.capacity, scenario.clients) == (2, 40, 3, None)
    assert scenario.requests == 3 * SMALL.requests


def test_videos_are_timed_by_bench_mixed_s_table_and_kept_out_of_the_images_p95():
    mixed = dataclasses.replace(SMALL, video_share=0.05)
    costs = scaled_costs(inference_s=0.425, swap_s=0.004, prepare_s=0.03, options=mixed)
    k = 0.425 / Costs.inference_s
    # The stand-in's waits and the model's video: Wan's 50 steps and 81 frames' 21 latent frames, each scaled by k.
    assert video_waits(k) == (pytest.approx(WAN_STEP_S * k), pytest.approx(WAN_A10G[3] * k))
    assert sum(costs.pieces(True, split=True)) == pytest.approx((50 * WAN_STEP_S + 21 * WAN_A10G[3]) * k)
    scenario = scaled_scenario(mixed, costs)
    # Each pool its own deployment: no run waits for another pool's (what the model calls `off`).
    assert (scenario.video_share, scenario.device_sharing) == (0.05, "off")
    images = [Sample(i, 0.0, 0.5 + i / 100, 200, i % 2 == 0, "r", {"total": 0.4}) for i in range(20)]
    videos = [Sample(20 + i, 0.0, 30.0 + i, 200, False, "r", {"total": 29.0}, video=True) for i in range(2)]
    found = summarise("ours", 1.0, images + videos)
    # The images' p95 is the 19th of their 20 latencies (nearest rank), the videos' the later of their two.
    assert (found.p95_s, found.videos, found.video_p95_s) == (pytest.approx(0.5 + 18 / 100), 2, 31.0)
    assert found.hit_rate == pytest.approx(10 / 22)  # over every request, as the model counts it


def run(router: str, rate: float, hit: float, p95: float) -> RealRun:
    return RealRun(router, rate, 120, 0, hit, p95 / 2, p95, 1.0, 0.4, 0.004, 0.03)


def test_each_rate_is_set_beside_the_model_and_drawn(tmp_path):
    costs = scaled_costs(inference_s=0.4, swap_s=0.004, prepare_s=0.03)
    runs = [
        run("ours", 2.0, 0.40, 0.9),
        run("ours", 1.0, 0.45, 0.5),
        run("ray_multiplexed", 0.5, 0.45, 0.5),
        run("ray_multiplexed", 1.0, 0.35, 0.9),
    ]
    said: list[str] = []
    results = _compare(SMALL, runs, costs, target=0.7, k=0.05, wall=1.0, say=said.append)
    assert len(results["runs"]) == 4 and len(said) == 4
    for router, summary in results["routers"].items():
        assert summary["rate_at_target"] == pytest.approx(1.5 if router == "ours" else 0.75)
        assert summary["hit_rate"] == pytest.approx(0.425 if router == "ours" else 0.40)
        assert len(summary["sim_gaps"]) == 2 and summary["sim_gap"] == pytest.approx(sum(summary["sim_gaps"]) / 2)
        assert all(math.isfinite(r) for r in summary["p95_measured_over_model"])
        # p95_gap: |measured / model - 1| at each rate, averaged where the model's p95 is within twice the target.
        assert summary["p95_gaps"] == pytest.approx([abs(r - 1) for r in summary["p95_measured_over_model"]])
        rows = [r for r in results["runs"] if r["measured"]["router"] == router]
        assert [r["measured"]["rate"] for r in rows] == sorted(r["measured"]["rate"] for r in rows)
        models = [r["simulated"]["p95_s"] for r in rows]
        near = [gap for gap, model in zip(summary["p95_gaps"], models, strict=True) if model <= 1.4]
        assert near and summary["p95_gap"] == pytest.approx(sum(near) / len(near))
        assert [row["policy"] for row in summary["model_curve"]] == [POLICY_OF[router]] * 7
    (json_path, png) = plots.save_with_plots(results, tmp_path, "fleet-real")
    assert json.loads(json_path.read_text())["benchmark"] == "fleet_real" and is_png(png)


def test_the_model_runs_the_rates_in_turn_on_one_fleet_as_the_cluster_does():
    costs = scaled_costs(inference_s=1.0, swap_s=0.01, prepare_s=0.05)
    one = scaled_scenario(SMALL, costs)
    # One phase is the plain run.
    assert simulate_phases(one, make_policy("least_finish"), [0.5], seed=1) == [
        simulate(one, make_policy("least_finish"), 0.5, seed=1)
    ]
    two = scaled_scenario(SMALL, costs, phases=2)
    low, high = simulate_phases(two, make_policy("least_finish"), [0.3, 1.2], seed=1)
    assert (low.rate, high.rate) == (0.3, 1.2) and low.completed == high.completed == SMALL.requests
    # The second phase starts where the first left the caches: not a fresh run at its rate.
    assert high != simulate(one, make_policy("least_finish"), 1.2, seed=1)
    with pytest.raises(ValueError, match="not all positive"):
        simulate_phases(two, make_policy("least_finish"), [0.3, 0.0], seed=1)


def test_faster_gpus_hold_more_within_the_target_and_each_price_is_per_1000_images():
    scenario = Scenario(adapters=60, replicas=2, capacity=4, warmup=100, requests=400)
    said: list[str] = []
    costs = gpu_costs(scenario, "least_finish", 13.0, 0, said.append)
    assert [c.gpu for c in costs] == [g.name for g in GPUS] == ["A10G", "L40S", "H100"]
    assert costs[0].rate < costs[1].rate < costs[2].rate
    for cost in costs:
        assert cost.dollars_per_1000 == pytest.approx(2 * cost.dollars_per_hour / (cost.rate * 3600) * 1000)
    assert len(said) == 3 and all("per 1,000 images" in line for line in said)
    assert dataclasses.asdict(costs[0])["inference_s"] == 8.5


def test_the_model_can_warm_up_from_closed_loop_clients_then_measure_poisson_arrivals():
    costs = scaled_costs(inference_s=1.0, swap_s=0.01, prepare_s=0.05)
    scenario = scaled_scenario(SMALL, costs)
    assert scenario.warmup_clients == SMALL.clients
    warm = simulate(scenario, make_policy("least_finish"), 0.3, seed=1)
    cold = simulate(dataclasses.replace(scenario, warmup_clients=None), make_policy("least_finish"), 0.3, seed=1)
    assert warm.completed == cold.completed == SMALL.requests
    assert warm != cold  # the same requests, another warm-up: other disks and caches when measuring starts
    with pytest.raises(ValueError, match="warmup_clients=0 is too small"):
        dataclasses.replace(scenario, warmup_clients=0)


def test_the_last_line_says_na_for_a_router_within_the_target_at_no_rate(monkeypatch, capsys):
    # Regression: the published run ended `ours_rate=0.000 ... ratio=0.00` when ours met the target at no rate tried.
    import bench.fleet

    def summary(rate: float, found: str) -> dict[str, object]:
        return {
            "rate_at_target": rate,
            "found": found,
            "model_rate_at_target": 3.0,
            "hit_rate": 0.6,
            "sim_gaps": [0.02],
            "sim_gap": 0.02,
            "p95_measured_over_model": [1.4],
            "p95_gap": 0.4,
        }

    routers = {"ours": summary(0.0, "none"), "ray_multiplexed": summary(1.118, "interpolated")}
    results = {"routers": routers, "target_p95_s": 0.9, "k": 0.069, "wall_s": 1.0}
    monkeypatch.setattr(bench.fleet, "measure", lambda *args: results)
    monkeypatch.setattr(bench.fleet, "hub_environment", lambda root: 0)
    assert bench.fleet.main(["--real"]) == 0
    out = capsys.readouterr().out
    assert "ours_rate=na ray_rate=1.118 ratio=na " in out.splitlines()[-1]
    assert "ratio: not measured: ours within the target at no rate tried" in out
