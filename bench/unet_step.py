"""A real-width SDXL UNet step, eager against compiled, side by side in one run: what COMPILE buys on a model.

    python -m bench.unet_step [--device cuda] [--dtype float16] [--side 1024] [--modes default,reduce-overhead]
                              [--repeats 5] [--tiny]

`bench.compile` measures compiling through the engine's swaps on the tiny pipelines and a one-block slice; on a GPU
its full models come from the Hub, which a lent machine cannot reach. This builds the full-size SDXL UNet (2.57 B
parameters, random weights, `bench.sdxl_unet`; no download) and times one step at a `--side`² image's latents with
classifier-free guidance (batch 2), compiled as a pool's denoiser is (`engine.pipeline.compiled.compile_denoiser`),
eager and compiled calls taking turns (load from other processes falls on both alike). `--tiny` takes the tiny
pipeline's UNet config instead (the smoke test's size). Per mode it prints
`unet_step: mode=<mode> eager_ms=<ms> compiled_ms=<ms> speedup=<eager/compiled> max_diff=<|compiled - eager| over
eager's range> compile_s=<s>` (on CUDA also `eager_peak_reserved_gib=<GiB>`: the allocator's peak over one eager
step, weights included); the last line is the same with the modes joined, the smallest speed-up and the
largest difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/unet_step.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from bench.measure import Clock, cpu_description
from bench.sdxl_unet import build_sdxl_unet
from engine.pipeline.compiled import compile_denoiser

__all__ = ["main", "measure", "step_inputs"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def step_inputs(config: dict[str, Any], side: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """One guided step's inputs (batch 2: the prompt and the negative), as SDXL's pipeline builds them."""
    generator = torch.Generator().manual_seed(0)
    latent = side // 8

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    # SDXL's pooled text embedding is what is left of its additional embedding after the six time ids.
    pooled = config["projection_class_embeddings_input_dim"] - 6 * config["addition_time_embed_dim"]
    return {
        "sample": randn(2, config["in_channels"], latent, latent),
        "timestep": torch.tensor([500, 500], device=device),
        "encoder_hidden_states": randn(2, 77, config["cross_attention_dim"]),
        "added_cond_kwargs": {
            "text_embeds": randn(2, pooled),
            "time_ids": torch.tensor([[side, side, 0, 0, side, side]] * 2, device=device, dtype=dtype),
        },
    }


def measure(unet: torch.nn.Module, inputs: dict[str, Any], mode: str, repeats: int) -> dict[str, Any]:
    """One mode: compile, then eager and compiled steps taking turns; the compiled UNet is removed after."""
    device = next(unet.parameters()).device
    clock = Clock(device)
    with torch.inference_mode():
        peak_gib = _eager_peak_gib(unet, inputs)
        compiled = compile_denoiser(unet, mode, [(0, 0)], lambda _w, _h: unet(**inputs))
        try:
            eager_out, compiled_out = compiled.eager(**inputs).sample, compiled(**inputs).sample
            span = float(eager_out.float().max() - eager_out.float().min())
            diff = float((compiled_out.float() - eager_out.float()).abs().max()) / span if span else 0.0
            times: dict[str, list[float]] = {"eager": [], "compiled": []}
            for _ in range(repeats):
                for name, call in (("eager", compiled.eager), ("compiled", compiled)):
                    started = clock()
                    call(**inputs)
                    times[name].append(clock() - started)
        finally:
            compiled.remove()
    eager_ms, compiled_ms = (statistics.median(times[name]) * 1000 for name in ("eager", "compiled"))
    return {
        "mode": mode,
        "eager_ms": eager_ms,
        "compiled_ms": compiled_ms,
        "speedup": eager_ms / compiled_ms,
        "max_diff": diff,
        "compile_s": compiled.compile_s,
        "recompiles": compiled.recompiles,
        "eager_peak_reserved_gib": peak_gib,
    }


def _eager_peak_gib(unet: torch.nn.Module, inputs: dict[str, Any]) -> float | None:
    """The most memory torch's allocator reserved over one eager step (weights included); None off CUDA."""
    device = next(unet.parameters()).device
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    unet(**inputs)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_reserved(device) / 2**30


def line(rows: Sequence[dict[str, Any]]) -> str:
    peaks = [r["eager_peak_reserved_gib"] for r in rows if r["eager_peak_reserved_gib"] is not None]
    return (
        f"unet_step: mode={','.join(r['mode'] for r in rows)} eager_ms={max(r['eager_ms'] for r in rows):.1f} "
        f"compiled_ms={max(r['compiled_ms'] for r in rows):.1f} speedup={min(r['speedup'] for r in rows):.2f} "
        f"max_diff={max(r['max_diff'] for r in rows):.2g} compile_s={sum(r['compile_s'] for r in rows):.1f}"
        + (f" eager_peak_reserved_gib={max(peaks):.2f}" if peaks else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unet_step", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=sorted(_DTYPES), help="default float16 on cuda, else float32")
    parser.add_argument("--side", type=int, default=1024, help="image side; the latents are side/8 (default 1024)")
    parser.add_argument("--modes", default=None, help="COMPILE modes (default: default; on cuda also reduce-overhead)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny pipeline's UNet config (a smoke run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = _DTYPES[args.dtype or ("float16" if cuda else "float32")]
    modes = [m for m in (args.modes or ("default,reduce-overhead" if cuda else "default")).split(",") if m]
    if args.side < 64 or args.side % 64 or args.repeats < 1:
        parser.error(f"--side {args.side} / --repeats {args.repeats}; accepted: a multiple of 64, repeats >= 1")
    config = None
    if args.tiny:
        from engine.families.sdxl import build_tiny_pipeline

        config = dict(build_tiny_pipeline().unet.config)
    print(
        f"unet step: {'tiny' if args.tiny else 'full-size SDXL'} UNet, {args.side}² (batch 2), "
        f"{str(dtype).removeprefix('torch.')} "
        f"on {device} ({torch.cuda.get_device_name(device) if cuda else cpu_description()[0]}), torch "
        f"{torch.__version__}, {args.repeats} repeats",
        flush=True,
    )
    unet = build_sdxl_unet(dtype=dtype, device=device, config=config)
    inputs = step_inputs(dict(unet.config), args.side, device, dtype)
    rows = []
    for mode in modes:
        rows.append(measure(unet, inputs, mode, args.repeats))
        print(line(rows[-1:]), flush=True)
    print(line(rows))
    return 0 if all(r["recompiles"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
