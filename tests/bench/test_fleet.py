"""The fleet model on small scenarios: its policies' properties, determinism, the search, the last line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable

import pytest

from bench import fleet
from bench.fleet_model import Costs, Fleet, Replica, Request, Scenario, request_stream, simulate
from bench.fleet_policies import POLICIES, RayMultiplexed, RoutingContext, make_policy
from bench.fleet_sweep import latency_curve, max_rate, simulated_hit_rate, validation_spec

LAST_LINE = re.compile(
    r"^fleet: adapters=(\d+) replicas=(\d+) best_policy=(\w+) max_rate_at_p95_13s=(\d+\.\d{3}) "
    r"vs_random=(\d+\.\d{2}|na) hit_rate=(\d\.\d{3}|na) sim_vs_ray_hit_rate_gap=(\d\.\d{3}|na)$"
)
SKEWED = Scenario(adapters=60, replicas=3, capacity=4, zipf=1.2, warmup=300, requests=1500)
SMALL_ARGS = ["--adapters", "40", "--replicas", "2", "--capacity", "3", "--warmup", "100", "--requests", "400"]


def hit_rate(policy: str, scenario: Scenario = SKEWED, load: float = 0.3, seed: int = 0) -> float:
    return simulate(scenario, make_policy(policy), load * scenario.saturation_rate, seed).hit_rate


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "random"])
def test_adapter_aware_policies_hit_more_than_random_on_a_skewed_load(policy):
    for seed in (0, 1):
        assert hit_rate(policy, seed=seed) > hit_rate("random", seed=seed) + 0.05


def test_a_seed_gives_the_same_run_and_another_seed_another():
    first, again = (simulate(SKEWED, make_policy("ray_multiplexed_m1"), 0.5, seed=4) for _ in range(2))
    assert first == again
    assert simulate(SKEWED, make_policy("ray_multiplexed_m1"), 0.5, seed=5) != first
    assert request_stream(SKEWED, 4) == request_stream(SKEWED, 4) != request_stream(SKEWED, 5)


def test_one_replica_holding_every_adapter_always_hits_and_never_waits_when_sequential():
    costs = Costs(inference_s=2.0, swap_cpu_s=0.5, swap_scale=1.0)
    scenario = Scenario(adapters=5, replicas=1, capacity=5, warmup=50, requests=200, clients=1, costs=costs)
    result = simulate(scenario, make_policy("least_finish"), 1.0)
    adapters, _ = request_stream(scenario, 0)
    measured = adapters[scenario.warmup - 1 :]
    changes = sum(a != b for a, b in itertools.pairwise(measured))
    assert result.hit_rate == 1.0 and result.downloads_per_s == 0.0
    assert result.swaps_per_request == changes / scenario.requests
    # Nothing waits: each latency is the inference, plus the swap when the adapter changed.
    assert result.p95_s == pytest.approx(2.5)
    assert result.mean_s == pytest.approx(2.0 + 0.5 * changes / scenario.requests)


def test_ray_router_tries_holders_first_then_the_fewest_models_then_every_replica():
    scenario = Scenario(adapters=10, replicas=4, capacity=3, warmup=0, requests=1)
    policy = RayMultiplexed(1)
    world = Fleet(scenario, policy, seed=0)
    holder, empty, *full = world.replicas
    holder.prepared.update({7: None, 1: None})
    for replica in full:
        replica.prepared.update({1: None, 2: None, 3: None})
    context = RoutingContext(started=0.0)
    assert policy._candidates(world, 7, context) == [holder]  # the id's holder first
    assert policy._candidates(world, 7, context) == [empty]  # then the fewest models
    fresh = RoutingContext(started=0.0)
    assert policy._candidates(world, 9, fresh) == [empty]  # nobody holds it: the fewest models at once
    other = RoutingContext(started=0.0)
    assert policy._candidates(world, 9, other) == []  # a concurrent request for it waits (fallback taken)
    world.env.run(until=2.5)  # past the matching timeout, drawn in [1 s, 2 s)
    late = RoutingContext(started=0.0)
    assert policy._candidates(world, 7, late) == [empty]
    assert policy._candidates(world, 7, late) == world.replicas


def test_ray_router_never_sends_a_replica_more_than_max_ongoing_requests():
    for limit in (1, 2):
        world = Fleet(SKEWED, RayMultiplexed(limit), seed=0)
        peaks = dict.fromkeys(range(SKEWED.replicas), 0)
        for replica in world.replicas:
            replica.accept = counting(replica, peaks)  # type: ignore[method-assign]
        world.run([SKEWED.saturation_rate * 1.2], seed=0)  # overloaded: the router holds the queue
        assert set(peaks.values()) == {limit}


def counting(replica: Replica, peaks: dict[int, int]) -> Callable[[Request], None]:
    accept = replica.accept

    def counted(request: Request) -> None:
        accept(request)
        peaks[replica.index] = max(peaks[replica.index], replica.ongoing)

    return counted


def test_under_saturation_ray_affinity_falls_towards_random_and_sequential_keeps_it():
    spec = validation_spec()
    scenario = dict(spec["scenario"])
    sequential_ray = simulated_hit_rate({**spec, "seeds": 3})
    sequential_random = simulated_hit_rate({**spec, "policy": "random", "seeds": 3})
    saturated = {**scenario, "clients": None}
    busy_ray = simulated_hit_rate({**spec, "scenario": saturated, "rate": 8.0, "seeds": 3})
    busy_random = simulated_hit_rate({**spec, "scenario": saturated, "policy": "random", "rate": 8.0, "seeds": 3})
    assert sequential_ray > sequential_random + 0.1
    assert abs(busy_ray - busy_random) < 0.05


def test_max_rate_holds_the_target_and_the_curve_passes_it():
    scenario = dataclasses.replace(SKEWED, warmup=100, requests=600)
    curve = latency_curve(scenario, "least_finish", seed=0, fractions=(0.1, 0.5, 0.9))
    best = max_rate(scenario, "least_finish", curve, target_p95_s=13.0, seed=0)
    assert best.at_rate is not None and best.at_rate.p95_s <= 13.0
    assert 0 < best.rate < scenario.saturation_rate
    assert curve[-1].p95_s > 13.0 and best.rate >= max(r.rate for r in curve if r.p95_s <= 13.0)


def test_unknown_policy_and_bad_scenario_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown policy 'nearest'; accepted: random"):
        make_policy("nearest")
    with pytest.raises(ValueError, match="capacity=0 is too small"):
        Scenario(capacity=0)


def test_the_run_ends_with_the_fleet_line_and_reads_a_validation_file(tmp_path, capsys):
    measured = {**validation_spec(), "measured_hit_rate": 0.45, "seeds": 2}
    (tmp_path / "ray.json").write_text(json.dumps(measured))
    argv = [*SMALL_ARGS, "--policies", "random,least_finish", "--json", str(tmp_path / "out.json")]
    assert fleet.main([*argv, "--validate-json", str(tmp_path / "ray.json")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    results = json.loads((tmp_path / "out.json").read_text())
    assert match.group(1, 2, 3) == ("40", "2", results["best_policy"])
    assert float(match[7]) == pytest.approx(abs(0.45 - results["validation"]["simulated_hit_rate"]), abs=1e-3)
    assert results["final_line"] == lines[-1]
    assert fleet.main([*SMALL_ARGS, "--policies", "random"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("sim_vs_ray_hit_rate_gap=na")
    # Every miss downloads at 1 MB/s: no rate meets the target, and the line says so.
    slow_hub = ["--disk-gb", "0", "--bandwidth-mbs", "1", "--warmup", "10", "--requests", "60"]
    assert fleet.main([*SMALL_ARGS, "--policies", "random", *slow_hub]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert LAST_LINE.match(last) and "best_policy=none max_rate_at_p95_13s=0.000 vs_random=na hit_rate=na" in last


def test_bad_arguments_name_what_is_accepted(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fleet.main(["--policies", "least_finish"])
    assert "lacks random" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fleet.main(["--replicas", "0"])
    assert "--replicas 0 is too small" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="no numeric measured_hit_rate"):
        fleet.main([*SMALL_ARGS, "--policies", "random", "--validate-json", str(tmp_path / "bad.json")])


def test_swap_time_comes_from_a_bench_swap_json(tmp_path):
    (tmp_path / "gpu.json").write_text(json.dumps({"headline": {"swap_ms": 21.0}, "options": {"device": "cuda"}}))
    (tmp_path / "cpu.json").write_text(json.dumps({"headline": {"swap_ms": 400.0}, "options": {"device": "cpu"}}))
    gpu = fleet.scenario_of(fleet.parse(["--swap-json", str(tmp_path / "gpu.json")])).costs
    cpu = fleet.scenario_of(fleet.parse(["--swap-json", str(tmp_path / "cpu.json")])).costs
    assert gpu.swap_s == pytest.approx(0.021) and gpu.swap_scale == 1.0
    assert cpu.swap_s == pytest.approx(0.4 * Costs.swap_scale)
    with pytest.raises(SystemExit, match=r"not a bench\.swap JSON file"):
        fleet.scenario_of(fleet.parse(["--swap-json", str(tmp_path / "missing.json")]))
