"""Sweeps over the fleet model: latency against arrival rate, the highest rate within a p95 target, and
the small scenario that a real Ray Serve cluster runs to validate the model's hit rate.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fleet_model import Costs, RunResult, Scenario, simulate
from .fleet_policies import make_policy

__all__ = [
    "RATE_FRACTIONS",
    "MaxRate",
    "Validation",
    "latency_curve",
    "max_rate",
    "scenario_from_dict",
    "simulated_hit_rate",
    "validate",
    "validation_spec",
]

# Arrival rates tried, as fractions of the rate at which every GPU is busy with inference alone.
RATE_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_BISECTIONS = 6


def run(scenario: Scenario, policy: str, rate: float, seed: int) -> RunResult:
    return simulate(scenario, make_policy(policy), rate, seed)


def latency_curve(
    scenario: Scenario, policy: str, seed: int, fractions: Sequence[float] = RATE_FRACTIONS
) -> list[RunResult]:
    return [run(scenario, policy, round(f * scenario.saturation_rate, 4), seed) for f in fractions]


@dataclass(frozen=True)
class MaxRate:
    """The highest arrival rate found with p95 latency within the target, and the run at that rate."""

    policy: str
    rate: float  # 0.0 when even the lowest rate tried misses the target
    at_rate: RunResult | None


def max_rate(scenario: Scenario, policy: str, curve: Sequence[RunResult], target_p95_s: float, seed: int) -> MaxRate:
    """Bisect between the last rate of `curve` within the target and the first one past it.

    The runs share their random numbers (bench/fleet_model.py), so p95 grows with the rate almost
    monotonically and a bisection finds the edge.
    """
    ordered = sorted(curve, key=lambda r: r.rate)
    failing = next((i for i, r in enumerate(ordered) if r.target_p95_s > target_p95_s), None)
    if failing == 0:
        return MaxRate(policy, 0.0, None)
    low = ordered[-1] if failing is None else ordered[failing - 1]
    high = scenario.saturation_rate if failing is None else ordered[failing].rate
    best = low
    for _ in range(_BISECTIONS):
        middle = run(scenario, policy, round((best.rate + high) / 2, 5), seed)
        if middle.target_p95_s <= target_p95_s:
            best = middle
        else:
            high = middle.rate
    return MaxRate(policy, best.rate, best)


def validation_spec() -> dict[str, object]:
    """The small scenario to run on a real local Ray Serve cluster (the tiny pipeline on CPU replicas).

    Two replicas holding 3 adapters each, 30 adapters, Zipf 1.1 (the setting of the measurement quoted
    in issue 13), one client sending requests one after another: there the hit rate depends on the
    routing and the caches alone, not on timings, and tells Ray's multiplexed routing from random
    (about 0.5 against 0.3). For each seed the cluster's run sends the adapters of
    `request_stream(scenario_from_dict(spec["scenario"]), seed)` in order, counts hits after the first
    `warmup` requests, and writes this dict back with `measured_hit_rate` (the mean over the seeds)
    added; `--validate-json` reads it. For a Poisson run set "clients" to null, "rate", and the costs
    the cluster measures (tiny-pipeline inference, local files: no download).
    """
    costs = Costs(inference_s=0.5, swap_cpu_s=0.005, swap_scale=1.0, prepare_base_s=0.02, bandwidth_mb_s=1e9)
    scenario = Scenario(
        adapters=30, replicas=2, capacity=3, disk_gb=1e6, zipf=1.1, warmup=20, requests=300, clients=1, costs=costs
    )
    return {"scenario": dataclasses.asdict(scenario), "policy": "ray_multiplexed_m1", "rate": 1.0, "seeds": 5}


def scenario_from_dict(data: Mapping[str, Any]) -> Scenario:
    """Build a Scenario from its asdict form; unknown keys are refused by name."""
    fields = {f.name for f in dataclasses.fields(Scenario)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"unknown scenario keys {sorted(unknown)}; accepted: {sorted(fields)}")
    values = dict(data)
    costs = values.pop("costs", {})
    if not isinstance(costs, Mapping):
        raise ValueError(f"scenario costs must be a mapping, got {type(costs).__name__}")
    cost_fields = {f.name for f in dataclasses.fields(Costs)}
    if set(costs) - cost_fields:
        raise ValueError(f"unknown cost keys {sorted(set(costs) - cost_fields)}; accepted: {sorted(cost_fields)}")
    return Scenario(**values, costs=Costs(**costs))


def simulated_hit_rate(spec: Mapping[str, Any]) -> float:
    """The model's hit rate for a validation spec (validation_spec's shape), averaged over its seeds."""
    scenario = scenario_from_dict(spec.get("scenario", {}))
    policy, rate, seeds = str(spec.get("policy")), float(spec.get("rate", 1.0)), int(spec.get("seeds", 5))
    return statistics.fmean(run(scenario, policy, rate, seed).hit_rate for seed in range(seeds))


@dataclass(frozen=True)
class Validation:
    measured_hit_rate: float
    simulated_hit_rate: float

    @property
    def gap(self) -> float:
        return abs(self.measured_hit_rate - self.simulated_hit_rate)


def validate(path: Path, progress: Callable[[str], None] | None = None) -> Validation:
    """Read a measured run (validation_spec plus `measured_hit_rate`) and simulate the same scenario."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the validation file {path}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("measured_hit_rate"), int | float):
        raise ValueError(f"{path} has no numeric measured_hit_rate; accepted: validation_spec() plus that key")
    spec = {**validation_spec(), **data}
    if progress is not None:
        progress(f"validation: simulating {path.name}'s scenario with {spec['policy']} at {spec['rate']} req/s")
    return Validation(float(data["measured_hit_rate"]), simulated_hit_rate(spec))
