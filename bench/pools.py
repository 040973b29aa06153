"""The pool-offload benchmark: bringing an offloaded model back, at the floor of copying its bytes.

    python -m bench.pools [--models sd15,sdxl,flux] [--repeats N] [--device cpu|cuda] [--dtype bfloat16|float16]

When the pools do not all fit the device, the least recently used pipeline waits in host RAM and is moved back
on demand by `engine.pools.flat.FlatWeights` (every tensor a view of one flat buffer: one copy, the Parameter
objects kept). This measures that move for full-size SD 1.5 and SDXL UNets and a real-width FLUX.1 transformer
slice (2 double and 4 single blocks at width 3072, 2.4 GiB in bf16; the whole transformer is 23.8 GB), random
weights, against two others, side by side in one run, each repeat taking turns so that load from other
processes falls on all alike:
- the floor: one contiguous copy of the same bytes from the same place, the pool's host buffer (pinned on CUDA),
  into a newly allocated buffer on the device (on the CPU, host RAM);
- per tensor: the move as it was before the flat buffers, one allocation and one copy per tensor.
After every move every tensor must equal its regenerated value (`exact`). On the CPU the ratios are of the
process's CPU seconds (a copy there is CPU work; on a shared machine the wall clock mostly measures the other
processes, and is printed beside), on a GPU of wall seconds.

The last line is `restore_vs_floor=<ours/floor> exact=<true|false>`, the worst model's median ratio.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/pools.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from diffusers import FluxTransformer2DModel
from torch import nn

from bench.flux_slice import FLUX_SLICE_CONFIG
from bench.measure import Clock, cpu_description
from bench.sdxl_unet import (
    POOL_SIZE,
    SDXL_UNET_CONFIG,
    build_filled,
    build_sdxl_unet,
    mismatched_tensors,
    random_pool,
)
from engine.pools.flat import FlatWeights, module_tensors

# stable-diffusion-v1-5/stable-diffusion-v1-5, unet/config.json (the fields that differ from diffusers' defaults).
SD15_UNET_CONFIG: dict[str, Any] = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": (320, 640, 1280, 1280),
    "layers_per_block": 2,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "attention_head_dim": 8,
    "cross_attention_dim": 768,
    "norm_num_groups": 32,
}
CONFIGS = {"sd15": SD15_UNET_CONFIG, "sdxl": SDXL_UNET_CONFIG}
MODELS = (*CONFIGS, "flux")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _timed(clock: Clock, run: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) that `run` takes."""
    wall, cpu = clock(), time.process_time()
    run()
    return clock() - wall, time.process_time() - cpu


def build(name: str, dtype: torch.dtype, pool: torch.Tensor) -> nn.Module:
    """The model `name` in host RAM, every tensor filled from `pool` (see `bench.sdxl_unet`)."""
    if name != "flux":
        return build_sdxl_unet(dtype=dtype, device="cpu", pool=pool, config=CONFIGS[name])
    # The slice `bench.swap --family flux` swaps on (bench.flux_slice).
    return build_filled(FluxTransformer2DModel, FLUX_SLICE_CONFIG, dtype=dtype, device=torch.device("cpu"), pool=pool)


@torch.no_grad()
def per_tensor(module: nn.Module, device: torch.device) -> None:
    """The move before flat buffers: one new tensor per parameter and buffer."""
    for tensor in module_tensors([module]):
        tensor.data = tensor.data.to(device, copy=True, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, model: nn.Module, pool: torch.Tensor, repeats: int, device: torch.device) -> dict[str, Any]:
    """Bring `model` (filled from `pool`, in host RAM) to `device` `repeats` times each way, side by side.

    Ratios are of CPU seconds on the CPU (a copy there is CPU work, and on a shared machine the wall clock mostly
    measures the other processes), of wall seconds on a GPU (the copy engine's work: the CPU only waits).
    """
    weights = FlatWeights([model], pin=device.type == "cuda")
    clock = Clock(device)

    def ours() -> tuple[float, float]:
        weights.to_host()
        return _timed(clock, lambda: weights.to_device(device))

    def floor() -> tuple[float, float]:
        weights.to_host()
        host = weights.host_buffer
        return _timed(clock, lambda: host.to(device, copy=True, non_blocking=True))

    def old() -> tuple[float, float]:
        weights.to_host()
        return _timed(clock, lambda: per_tensor(model, device))

    methods = {"ours": ours, "floor": floor, "per_tensor": old}
    times: dict[str, list[tuple[float, float]]] = {method: [] for method in methods}
    exact = True
    for repeat in range(repeats):
        # A different order each repeat, so that a drift in the machine's load falls on every method alike.
        order = list(methods)[repeat % 3 :] + list(methods)[: repeat % 3]
        for method in order:
            times[method].append(methods[method]())
            exact = exact and not mismatched_tensors(model, pool)
            gc.collect()
    basis = 1 if device.type == "cpu" else 0

    def median(method: str, index: int = basis) -> float:
        return statistics.median(t[index] for t in times[method])

    def ratio(method: str, index: int = basis) -> float:
        return statistics.median(a[index] / b[index] for a, b in zip(times[method], times["floor"], strict=True))

    return {
        "model": name,
        "gib": weights.nbytes / 2**30,
        "tensors": sum(1 for _ in module_tensors([model])),
        "basis": ("wall", "cpu")[basis],
        "ours_s": median("ours"),
        "floor_s": median("floor"),
        "old_s": median("per_tensor"),
        "ratio": ratio("ours"),
        "old_ratio": ratio("per_tensor"),
        "wall_ratio": ratio("ours", 0),
        "gb_per_s": weights.nbytes / 1e9 / median("ours", 0),
        "exact": exact,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pools", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), _DTYPES[args.dtype]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; accepted: {', '.join(MODELS)}")
    threads = torch.get_num_threads()
    print(f"bring an offloaded model back: {args.device}, {args.dtype}, {args.repeats} repeats, {threads} threads")
    print(f"cpu: {cpu_description()[0]}")
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(device)}")
    basis = "CPU" if device.type == "cpu" else "wall"
    print(f"times and ratios in {basis} seconds (medians); GB/s and the last ratio in wall seconds")
    print(
        f"{'model':6} {'GiB':>6} {'tensors':>7} {'ours s':>8} {'floor s':>8} {'per-tensor s':>12} "
        f"{'ours/floor':>10} {'per-tensor/floor':>16} {'GB/s':>6} {'wall ours/floor':>15} exact"
    )
    rows = []
    for name in models:
        # FLUX's largest tensor (a double block's modulation, 3072 -> 6 x 3072) needs a larger pool than a UNet's.
        pool = random_pool(size=4 * POOL_SIZE if name == "flux" else POOL_SIZE)
        row = measure(name, build(name, dtype, pool), pool, args.repeats, device)
        gc.collect()  # the model and its buffers, before the next one is built
        rows.append(row)
        print(
            f"{row['model']:6} {row['gib']:6.2f} {row['tensors']:7d} {row['ours_s']:8.3f} {row['floor_s']:8.3f} "
            f"{row['old_s']:12.3f} {row['ratio']:10.2f} {row['old_ratio']:16.2f} {row['gb_per_s']:6.2f} "
            f"{row['wall_ratio']:15.2f} {str(row['exact']).lower()}"
        )
    worst = max(r["ratio"] for r in rows)
    exact = all(r["exact"] for r in rows)
    print(f"restore_vs_floor={worst:.2f} exact={str(exact).lower()}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
