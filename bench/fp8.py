"""What a LoRA fused into stored weights keeps of itself, by storage dtype: the question behind a 24 GB FLUX path.

    python -m bench.fp8 [--rank 16] [--seed 0]

A FLUX.1 transformer in bf16 (23.8 GB) does not fit a 24 GB GPU beside inference; stored in fp8 (e4m3, one scale
per tensor, as fp8 checkpoints do) it would take 11.9 GB. The engine fuses ΔW into the stored weights, summed in
float32 and rounded once into the storage dtype, and restores the pristine bytes exactly, so the question is what
that one rounding leaves of ΔW. For real-width FLUX layers (3072 x 3072, a single block's 3072 -> 12288 MLP) with
random N(0, 0.02) weights and a rank-`rank` ΔW scaled to 1, 3 and 10 % of the weight's norm (a LoRA at scale 1
changes most layers by a few per cent), it prints the fused change's error relative to ΔW,
`|Q(W + ΔW) - Q(W) - ΔW| / |ΔW|`, and its cosine with ΔW, for fp16, bf16 and fp8 storage. Random weights and
deltas, not a model's: it says what the rounding does, not what an image would show.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/fp8.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
from collections.abc import Sequence

import torch

# The largest value fp8 e4m3 (`float8_e4m3fn`) holds: a per-tensor scale maps the weight's largest magnitude there.
_E4M3_MAX = 448.0
STORAGE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}
SHAPES = ((3072, 3072), (12288, 3072))
SHARES = (0.01, 0.03, 0.10)


def stored(weight: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """`weight` rounded once into `dtype` (divided by `scale` first) and read back in float32."""
    return (weight / scale).to(dtype).float() * scale


def kept(weight: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(relative error, cosine) of the change fusing `delta` makes to `weight` stored in `dtype`."""
    # The scale is fixed by the pristine weight, as an fp8 checkpoint's is; 1 for the 16-bit types.
    scale = float(weight.abs().max()) / _E4M3_MAX if dtype == torch.float8_e4m3fn else 1.0
    # Compared in float64: a float32 sum over 37 M values drifts in the third digit.
    change = (stored(weight + delta, dtype, scale) - stored(weight, dtype, scale)).double()
    wanted = delta.double()
    error = float((change - wanted).norm() / wanted.norm())
    cosine = float(torch.nn.functional.cosine_similarity(change.flatten(), wanted.flatten(), dim=0))
    return error, cosine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fp8", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    print(f"{'layer':>12} {'ΔW/W':>5} " + " ".join(f"{name + ' err':>13} {'cos':>6}" for name in STORAGE))
    worst: dict[str, float] = dict.fromkeys(STORAGE, 0.0)
    for rows, cols in SHAPES:
        weight = torch.randn(rows, cols, generator=generator) * 0.02
        up = torch.randn(rows, args.rank, generator=generator)
        down = torch.randn(args.rank, cols, generator=generator)
        direction = up @ down
        for share in SHARES:
            delta = direction * (share * weight.norm() / direction.norm())
            cells = []
            for name, dtype in STORAGE.items():
                error, cosine = kept(weight, delta, dtype)
                worst[name] = max(worst[name], error)
                cells.append(f"{error:13.3f} {cosine:6.3f}")
            print(f"{f'{rows}x{cols}':>12} {share:5.0%} " + " ".join(cells))
    print(" ".join(f"worst_error_{name}={value:.3f}" for name, value in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
