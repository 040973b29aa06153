"""The pool-offload benchmark: bringing an offloaded pipeline back, on full-size SD 1.5 and SDXL UNets.

    python -m bench.pools [--models sd15,sdxl] [--repeats N] [--device cpu|cuda] [--dtype bfloat16|float16]

When the pools do not all fit the device, the least recently used pipeline waits in host RAM and is
moved back on demand by `engine.pools.residency.move_modules` (tensor by tensor, keeping the Parameter
objects). This measures that move for the UNet (the bulk of a pipeline) against the floor of copying
its bytes: one contiguous copy of the same number of bytes (on the CPU an allocation plus a memcpy of a
buffer of up to 1 GiB, scaled to the UNet's bytes, which keeps the benchmark's memory small; on CUDA a
pinned host buffer copied to the device). Ours and the floor take turns, so load from other processes
falls on both alike. After every move every tensor must equal its regenerated value (`exact`).

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
from collections.abc import Sequence
from typing import Any

import torch

from bench.measure import Clock
from bench.sdxl_unet import SDXL_UNET_CONFIG, build_sdxl_unet, mismatched_tensors, random_pool
from engine.pools.residency import module_bytes, move_modules

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
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_FLOOR_CHUNK = 2**30


def _floor_s(nbytes: int, device: torch.device, clock: Clock) -> float:
    """Seconds to copy `nbytes` as one contiguous block (measured on up to 1 GiB, scaled)."""
    size = min(nbytes, _FLOOR_CHUNK)
    if device.type == "cuda":
        source = torch.empty(size, dtype=torch.uint8).pin_memory()
        started = clock()
        copy = source.to(device, non_blocking=True)
    else:
        source = torch.ones(size, dtype=torch.uint8)
        started = clock()
        copy = source.clone()
    elapsed = clock() - started
    del copy, source
    return elapsed * nbytes / size


def measure(name: str, repeats: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    pool = random_pool()
    host = torch.device("cpu")
    unet = build_sdxl_unet(dtype=dtype, device=host, pool=pool, config=CONFIGS[name])
    nbytes = module_bytes([unet])
    clock = Clock(device)
    ours, floor = [], []
    exact = True
    for _ in range(repeats):
        if device.type != "cpu":
            move_modules([unet], host)
        floor.append(_floor_s(nbytes, device, clock))
        started = clock()
        move_modules([unet], device)
        ours.append(clock() - started)
        exact = exact and not mismatched_tensors(unet, pool)
        gc.collect()
    del unet
    gc.collect()
    ratios = [o / f for o, f in zip(ours, floor, strict=True)]
    return {
        "model": name,
        "gib": nbytes / 2**30,
        "ours_s": statistics.median(ours),
        "floor_s": statistics.median(floor),
        "ratio": statistics.median(ratios),
        "gb_per_s": nbytes / 1e9 / statistics.median(ours),
        "exact": exact,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="sd15,sdxl", help="comma-separated: sd15, sdxl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), _DTYPES[args.dtype]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in CONFIGS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; accepted: {', '.join(CONFIGS)}")
    threads = torch.get_num_threads()
    print(f"bring an offloaded UNet back: {args.device}, {args.dtype}, {args.repeats} repeats, {threads} threads")
    print(f"{'model':6} {'GiB':>6} {'ours s':>8} {'floor s':>8} {'GB/s':>6} {'ratio':>6} exact")
    rows = []
    for name in models:
        row = measure(name, args.repeats, device, dtype)
        rows.append(row)
        print(
            f"{row['model']:6} {row['gib']:6.2f} {row['ours_s']:8.3f} {row['floor_s']:8.3f} "
            f"{row['gb_per_s']:6.2f} {row['ratio']:6.2f} {str(row['exact']).lower()}"
        )
    worst = max(r["ratio"] for r in rows)
    exact = all(r["exact"] for r in rows)
    print(f"restore_vs_floor={worst:.2f} exact={str(exact).lower()}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
