"""What the fleet costs: dollars per 1,000 images at the p95 target, on three GPUs, with stated sources.

For each GPU the fleet model is run again with that GPU's SDXL inference time (and the swap scaled by its memory
bandwidth against the A10G's), the highest rate within the target is found for the policy, and
cost per 1,000 images = replicas x hourly price / (rate x 3,600) x 1,000.

Prices: Hugging Face Inference Endpoints' list prices per GPU-hour, on AWS (A10G, L40S) and GCP (H100; AWS's H100
is marked deprecated from December 2025 at $4.50), from huggingface/hf-endpoints-documentation,
docs/source/support/pricing.md as last changed by commit 86ef8b3 of 2026-05-19 (the repository as of 2026-08-20;
check them, they change).

SDXL inference times (1024x1024, 25 steps, one image): the A10G's is the reference service's 8.5 s (docs/fleet.md).
The others are scaled from the PyTorch baseline of stabilityai/stable-diffusion-xl-1.0-tensorrt's model card
(30 steps at 1024x1024, non-optimised: A10 9,399 ms, A100 3,704 ms, H100 2,496 ms): H100 = 8.5 s x 2,496 / 9,399
= 2.26 s. No L40S figure comes from the same source: 4.0 s is an estimate, the A100's time (8.5 s x 3,704 / 9,399
= 3.35 s) over the L40S's relative SDXL throughput of about 0.84 of an A100 (6.1 against 7.3 images a minute,
bestgpucloud.com's "NVIDIA L40S" review, 2026-03-13), in line with its 362 dense FP16 tensor TFLOPS against the
A100's 312 but 864 GB/s of memory bandwidth against 2,039. Memory bandwidth for the swap: A10G 600 GB/s,
L40S 864 GB/s, H100 SXM 3,350 GB/s (NVIDIA's data sheets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .fleet_model import Scenario
from .fleet_sweep import latency_curve, max_rate

__all__ = ["GPUS", "Gpu", "GpuCost", "gpu_costs"]


@dataclass(frozen=True)
class Gpu:
    name: str
    dollars_per_hour: float
    price_source: str
    inference_s: float  # one 1024x1024, 25-step SDXL image
    inference_source: str
    bandwidth_gb_s: float


_HF_PRICES = "HF Inference Endpoints, pricing.md @ 86ef8b3 (2026-05-19)"
GPUS = (
    Gpu("A10G", 1.00, f"AWS nvidia-a10g x1, {_HF_PRICES}", 8.5, "the reference service", 600.0),
    Gpu("L40S", 1.80, f"AWS nvidia-l40s x1, {_HF_PRICES}", 4.0, "estimate: A100 baseline / 0.84", 864.0),
    Gpu("H100", 10.00, f"GCP nvidia-h100 x1, {_HF_PRICES}", 2.26, "SDXL TensorRT card, PyTorch baseline", 3350.0),
)


@dataclass(frozen=True)
class GpuCost:
    gpu: str
    dollars_per_hour: float
    inference_s: float
    rate: float  # requests/s within the p95 target, all replicas
    dollars_per_1000: float | None  # None when no rate meets the target


def gpu_costs(
    scenario: Scenario, policy: str, target_p95_s: float, seed: int, say: Callable[[str], None] = print
) -> list[GpuCost]:
    """Each GPU of `GPUS`: the highest rate within the target for `policy`, and what 1,000 images cost there."""
    reference = next(g for g in GPUS if g.name == "A10G")
    results = []
    for gpu in GPUS:
        costs = dataclasses.replace(
            scenario.costs,
            inference_s=gpu.inference_s,
            swap_scale=scenario.costs.swap_scale * reference.bandwidth_gb_s / gpu.bandwidth_gb_s,
        )
        on_gpu = dataclasses.replace(scenario, costs=costs)
        best = max_rate(on_gpu, policy, latency_curve(on_gpu, policy, seed), target_p95_s, seed)
        dollars = scenario.replicas * gpu.dollars_per_hour / (best.rate * 3600) * 1000 if best.rate else None
        results.append(GpuCost(gpu.name, gpu.dollars_per_hour, gpu.inference_s, best.rate, dollars))
        shown = "never within the target" if dollars is None else f"${dollars:.2f} per 1,000 images"
        say(
            f"  {gpu.name:<5} ${gpu.dollars_per_hour:5.2f}/h  {gpu.inference_s:4.2f} s/image  "
            f"{best.rate:6.3f} req/s  {shown}"
        )
    return results
