"""A Wan video step and its VAE decode at 480p on the GPU, timed, with peak memory (`bench/gpu_check.sh`).

    python -m bench.wan_step [--tiny] [--device cuda|cpu] [--repeats N]

One block of Wan's 14B transformer at real width (diffusers' `WanTransformer3DModel` defaults are the 14B's
config; a step's peak is one block's, as the blocks run one after the other), random weights, over 81 frames at
832 x 480 (21 latent frames, 32760 tokens) and UMT5's 512 text tokens, eager, one CFG branch (diffusers' call runs
the two one after the other): in bf16, and stored in fp8 with rank-128 branches holding a rank-64 LoRA
(`engine.weights.quantized`, as a `QUANTIZE=fp8` pool runs it: its step against bf16's is the quantized pool's
step cost on a GPU). Then Wan 2.1's VAE (`AutoencoderKLWan`, bf16) decodes those 21 latent frames to 81 frames
(after a one-frame warm-up). Steps: the median of `--repeats` after a warm-up. Peaks: the allocator's largest
allocation over the call beyond what was allocated before (the weights), against the plan's formulas
(`engine.families.wan_memory.step_bytes` / `decode_bytes` at 480p). Random weights: real ones change neither the
time nor the memory. `--tiny`: the tiny Wan's configs at 5 x 64 x 48, a smoke run (on the CPU, peaks `na`).

Two lines, the step's before the decode runs: `wan_step: size= tokens= bf16_step_ms= fp8_step_ms= fp8_vs_bf16=
step_peak_gib= fp8_step_peak_gib= planned_step_gib=` and `wan_decode: size= decode_ms= decode_peak_gib=
planned_decode_gib=`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/wan_step.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.families import wan_memory
from engine.weights.quantized import BranchedLinear, quantize_denoiser

__all__ = ["main"]

_GIB = 2**30
_MAX_RANK, _LORA_RANK = 128, 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, call: Callable[[], object]) -> tuple[float, float]:
    """(milliseconds, GiB allocated at the peak beyond what was allocated before; nan off CUDA) of one call."""
    cuda = device.type == "cuda"
    _sync(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    call()
    _sync(device)
    took = (time.perf_counter() - started) * 1000
    peak = (torch.cuda.max_memory_allocated(device) - before) / _GIB if cuda else float("nan")
    return took, peak


def _models(tiny: bool, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, tuple[int, int, int]]:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    if tiny:
        from engine.families.tiny_wan import build_tiny_pipeline

        pipe: Any = build_tiny_pipeline()
        return pipe.transformer.to(device, dtype), pipe.vae.to(device, dtype), (5, 64, 48)
    with torch.device(device):
        block, vae = WanTransformer3DModel(num_layers=1), AutoencoderKLWan()
    return block.to(dtype), vae.to(dtype), wan_memory.SIZE_480P


def _fp8_with_lora(block: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `block` stored in fp8 with branches of `_MAX_RANK`, each holding a random rank-64 LoRA."""
    stored = copy.deepcopy(block)
    quantize_denoiser(stored, rank=_MAX_RANK, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    for module in stored.modules():
        if isinstance(module, BranchedLinear):
            rank = min(_LORA_RANK, module.rank)
            down = torch.randn(rank, module.in_features, generator=generator) / module.in_features**0.5
            up = torch.randn(module.out_features, rank, generator=generator) * 0.01
            module.load_branch([(down.to(module.lora_down), up.to(module.lora_up), 1.0)])
    return stored


def _fmt(value: float) -> str:
    return "na" if value != value else f"{value:.2f}"


@torch.inference_mode()
def run(tiny: bool, device: torch.device, repeats: int, say: Callable[[str], None] = print) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    block, vae, (frames, width, height) = _models(tiny, device, dtype)
    block.eval()
    vae.eval()
    latent_frames = (frames - 1) // 4 + 1
    shape = (1, int(block.config.in_channels), latent_frames, height // 8, width // 8)
    latents = torch.randn(shape, device=device, dtype=dtype)
    text = torch.randn(1, 512, int(block.config.text_dim), device=device, dtype=dtype)
    timestep = torch.tensor([500], device=device)
    tokens = latent_frames * (height // 16) * (width // 16)

    def steps(model: torch.nn.Module) -> tuple[float, float]:
        model(latents, timestep, text, return_dict=False)  # warm-up (kernels chosen, allocator grown)
        timed = [_timed(device, lambda: model(latents, timestep, text, return_dict=False)) for _ in range(repeats)]
        return statistics.median(t for t, _ in timed), max(p for _, p in timed)

    bf16_ms, bf16_peak = steps(block)
    fp8 = _fp8_with_lora(block, dtype)
    del block
    fp8_ms, fp8_peak = steps(fp8)
    del fp8
    size = (frames, width, height)
    # Said before the decode runs: a decode cut short by gpu_check.sh's limit leaves the step's line.
    say(
        f"wan_step: size={frames}x{width}x{height} tokens={tokens} bf16_step_ms={bf16_ms:.1f} "
        f"fp8_step_ms={fp8_ms:.1f} fp8_vs_bf16={fp8_ms / bf16_ms:.3f} step_peak_gib={_fmt(bf16_peak)} "
        f"fp8_step_peak_gib={_fmt(fp8_peak)} "
        f"planned_step_gib={wan_memory.step_bytes(wan_memory.SHAPE_14B, *size) / _GIB:.2f}"
    )
    vae.decode(latents[:, : vae.config.z_dim, :1])  # warm-up: one latent frame
    decode_ms, decode_peak = _timed(device, lambda: vae.decode(latents[:, : vae.config.z_dim]))
    say(
        f"wan_decode: size={frames}x{width}x{height} decode_ms={decode_ms:.0f} decode_peak_gib={_fmt(decode_peak)} "
        f"planned_decode_gib={wan_memory.decode_bytes(wan_memory.SHAPE_14B, *size) / _GIB:.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wan_step", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny Wan's configs at 5x64x48 (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps each (default 3)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" and not args.tiny:
        parser.error(f"a full-size Wan step on {device}; accepted: a CUDA device (or --tiny)")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}; accepted: 1 or more")
    print(f"wan step benchmark: {'tiny' if args.tiny else 'one 14B block and Wan 2.1 VAE'} on {device}", flush=True)
    run(args.tiny, device, args.repeats, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
