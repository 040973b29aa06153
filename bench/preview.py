"""What a live preview costs, against one denoising step of the full-size SDXL UNet, side by side in one run.

    python -m bench.preview [--device cpu|cuda] [--dtype bfloat16|float16|float32] [--side 1024]
                            [--repeats N] [--step-repeats N] [--json PATH]

At full SDXL latent size (4 x 128 x 128 for a 1024² image) it times, in the benchmark's dtype:

(s) one forward pass of the full-size SDXL UNet (random weights, `bench.sdxl_unet`), batch 1 — a real
    step with classifier-free guidance runs batch 2, so the ratios below are upper bounds;
(l) the engine's linear preview (`engine.pipeline.preview.LinearPreview`, ComfyUI's SDXL latent->RGB factors), image
    included: what the per-step callback pays;
(t) the engine's AutoencoderTiny preview (`engine.pipeline.preview.TinyVaePreview`) with TAESDXL's architecture
    (diffusers' AutoencoderTiny defaults) and random weights: the cost is the architecture's, not the weights'.

The last line is `linear_vs_step=<l/s> taesd_vs_step=<t/s>`; the engine's budget is 5 % of a step per preview.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/preview.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from diffusers import AutoencoderTiny

from bench.measure import Clock
from bench.sdxl_unet import build_sdxl_unet
from engine.families.sdxl import LATENT_RGB
from engine.pipeline.preview import LinearPreview, TinyVaePreview
from lora_catalog.entries import Family

__all__ = ["main", "run"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _say(text: str) -> None:
    print(text, flush=True)


def _times(clock: Clock, work: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = clock()
        work()
        samples.append(clock() - started)
    return samples


def run(device: torch.device, dtype: torch.dtype, side: int, repeats: int, step_repeats: int) -> dict[str, object]:
    began = time.perf_counter()
    clock = Clock(device)
    latent_side = side // 8
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, latent_side, latent_side, generator=generator).to(device=device, dtype=dtype)

    linear = LinearPreview(LATENT_RGB, Family.SDXL)
    torch.manual_seed(0)
    tiny = TinyVaePreview(AutoencoderTiny().to(device=device, dtype=dtype).eval().requires_grad_(False), "random")
    linear(latents, None), tiny(latents, None)  # first calls allocate
    linear_s = _times(clock, lambda: linear(latents, None), repeats)
    tiny_s = _times(clock, lambda: tiny(latents, None), repeats)
    _say(
        f"linear preview {statistics.median(linear_s) * 1000:.2f} ms, TAESDXL {statistics.median(tiny_s) * 1000:.1f} ms"
    )

    _say(f"building the full-size SDXL UNet ({str(dtype).removeprefix('torch.')}) on {device} ...")
    unet = build_sdxl_unet(dtype=dtype, device=device)
    hidden = torch.randn(1, 77, 2048, generator=generator).to(device=device, dtype=dtype)
    added = {
        "text_embeds": torch.randn(1, 1280, generator=generator).to(device=device, dtype=dtype),
        "time_ids": torch.tensor([[side, side, 0, 0, side, side]], device=device, dtype=dtype),
    }
    timestep = torch.tensor([500], device=device)

    @torch.inference_mode()
    def step() -> object:
        return unet(latents, timestep, encoder_hidden_states=hidden, added_cond_kwargs=added).sample

    step_s = _times(clock, step, step_repeats)
    # Previews again after the step, so load from other processes falls on both sides alike.
    linear_s += _times(clock, lambda: linear(latents, None), repeats)
    tiny_s += _times(clock, lambda: tiny(latents, None), repeats)
    results = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "latent": [4, latent_side, latent_side],
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "step_ms": statistics.median(step_s) * 1000,
        "linear_ms": statistics.median(linear_s) * 1000,
        "taesd_ms": statistics.median(tiny_s) * 1000,
        "wall_s": time.perf_counter() - began,
    }
    results["linear_vs_step"] = results["linear_ms"] / results["step_ms"]
    results["taesd_vs_step"] = results["taesd_ms"] / results["step_ms"]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preview", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:<index> (default cpu)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))
    parser.add_argument("--side", type=int, default=1024, help="image side; the latent is side/8 (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="preview timings before and after the step")
    parser.add_argument("--step-repeats", type=int, default=1, help="UNet forward passes (default 1: slow on CPU)")
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    if args.side % 8 or args.side < 64:
        parser.error(f"--side {args.side} is not accepted; accepted: a multiple of 8, at least 64")
    results = run(torch.device(args.device), _DTYPES[args.dtype], args.side, args.repeats, args.step_repeats)
    _say(
        f"latent {results['latent']} {results['dtype']} on {results['device']} ({results['threads']} threads): "
        f"UNet step {results['step_ms']:.0f} ms, linear preview {results['linear_ms']:.2f} ms, "
        f"TAESDXL preview {results['taesd_ms']:.1f} ms; wall {results['wall_s']:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    _say(f"linear_vs_step={results['linear_vs_step']:.2e} taesd_vs_step={results['taesd_vs_step']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
