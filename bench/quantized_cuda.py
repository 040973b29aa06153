"""A GGUF Q4_K or int4 step on a GPU, with its peak memory, against the same slice in bf16 (bench/gpu_check.sh).

    python -m bench.quantized_cuda --storage gguf-q4_k|int4 [--device cuda] [--tokens 4096] [--repeats 3]

On a real-width slice of FLUX.1's transformer (`bench.flux_slice`: 1 double and 1 single block at width 3072, so
that writing its GGUF file and quantizing it fit seconds), filled from one pool of random values: stored as a pool
stores it in host RAM (`--storage gguf-q4_k`: written as a Q4_K file, `tests.support.gguf.write_gguf`, and read
back by diffusers then branched, `engine.weights.gguf`; `int4`: `engine.weights.int4` in groups of 128), moved to
the device, a rank-64 LoRA swapped in as its branch (`BranchedPatcher`), and stepped eagerly at `--tokens` image
tokens (a 1024² FLUX.1 image: 4096) taking turns with the bf16 slice with the same LoRA fused. It prints one line:

`quantized_cuda: storage= device= tokens= step_ms= bf16_step_ms= step_vs_bf16_fused= stored_gib= bf16_gib=
step_peak_gib= bf16_step_peak_gib= widened_gib= exact=`

`step_peak_gib`: the step's peak allocation above the weights (activations and the widened weights a
call holds), against `widened_gib`, the largest linear widened to bf16 (what the memory plan adds to a quantized
pool's working memory, `engine.pools.needs.dequantized_bytes`); `exact`: the stored bytes after the swap and the
steps are those loaded. On the CPU (`--device cpu`) it is a smoke run of the same path.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/quantized_cuda.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import copy
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from bench.flux_slice import FLUX_SLICE_CONFIG, build_flux_slice, flux_pool, flux_targets, write_flux_pair
from bench.measure import Clock
from bench.ours import Ours, round_robin
from bench.quantized import _inputs
from engine.pools.needs import dequantized_bytes
from engine.weights.branches import BranchedPatcher, Branches
from engine.weights.quantized import stored_bytes
from lora_catalog.entries import Family

__all__ = ["main"]

DTYPE = torch.bfloat16
CONFIG = {**FLUX_SLICE_CONFIG, "num_layers": 1, "num_single_layers": 1}
MAX_RANK, RANK, GROUP = 128, 64, 128
_GIB = 2**30


def _stored(bf16: nn.Module, storage: str, folder: Path) -> nn.Module:
    """The slice as a pool stores it in host RAM (before moving it to the device)."""
    if storage == "int4":
        from engine.weights.int4 import quantize_denoiser_int4

        quantized = copy.deepcopy(bf16)
        quantize_denoiser_int4(quantized, rank=MAX_RANK, dtype=DTYPE, group_size=GROUP)
        return quantized
    from diffusers import FluxTransformer2DModel

    from engine.weights.gguf import branch_gguf_denoiser, load_gguf_denoiser
    from tests.support.gguf import Q, write_gguf

    path = write_gguf(folder / "slice.gguf", bf16.state_dict(), Q.Q4_K, plain=("norm.",))
    model = load_gguf_denoiser(path, FluxTransformer2DModel, bf16, "transformer", DTYPE)
    branch_gguf_denoiser(model, rank=MAX_RANK, dtype=DTYPE)
    return model


def _peak(device: torch.device, call: Callable[[], object]) -> float:
    """GiB allocated at the peak of `call` above what was allocated before it (0 off CUDA)."""
    if device.type != "cuda":
        call()
        return 0.0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated(device) - before) / _GIB


@torch.no_grad()
def run(storage: str, device: torch.device, tokens: int, repeats: int) -> str:
    clock = Clock(device)
    bf16 = build_flux_slice(dtype=DTYPE, device=torch.device("cpu"), pool=flux_pool(), config=CONFIG)
    with tempfile.TemporaryDirectory(prefix="quantized-cuda-") as name:
        folder = Path(name)
        stored = _stored(bf16, storage, folder).to(device)
        loaded = stored_bytes(stored)
        widest = max(m.in_features * m.out_features for m in bf16.modules() if isinstance(m, nn.Linear))
        bf16 = bf16.to(device)
        sides = {}
        for name_, model in (("fused", bf16), ("ours", stored)):
            ours = Ours(model, device=device, dtype=DTYPE, max_rank=256, cache_bytes=2 * _GIB, family=Family.FLUX)
            if name_ == "ours":
                ours.patcher = BranchedPatcher(ours.patcher, Branches(ours.table, model))  # type: ignore[assignment]
            sides[name_] = ours
        pair = write_flux_pair(folder, flux_targets(bf16), rank=RANK, fmt="peft")
        for ours in sides.values():
            ours.swap(ours.prepare(pair.paths[0], "a"))
    given = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in _inputs(tokens).items()}
    steps = {name: (lambda _, m=ours.unet: m(**given)) for name, ours in sides.items()}
    samples = round_robin(clock, steps, repeats)
    peaks = {name: _peak(device, lambda s=step: s(0)) for name, step in steps.items()}
    ratio = statistics.median(o / f for o, f in zip(samples["ours"], samples["fused"], strict=True))
    size = {name: sum(t.nbytes for t in (*o.unet.parameters(), *o.unet.buffers())) for name, o in sides.items()}
    exact = stored_bytes(stored) == loaded
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (
        f"quantized_cuda: storage={storage} device={gpu.replace(' ', '_')} tokens={tokens} "
        f"step_ms={statistics.median(samples['ours']):.1f} bf16_step_ms={statistics.median(samples['fused']):.1f} "
        f"step_vs_bf16_fused={ratio:.2f} stored_gib={size['ours'] / _GIB:.3f} bf16_gib={size['fused'] / _GIB:.3f} "
        f"step_peak_gib={peaks['ours']:.3f} bf16_step_peak_gib={peaks['fused']:.3f} "
        f"widened_gib={dequantized_bytes(widest, DTYPE) / _GIB:.3f} exact={'true' if exact else 'false'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quantized_cuda", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--storage", choices=["gguf-q4_k", "int4"], required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=4096, help="image tokens (+ a quarter as many text tokens)")
    parser.add_argument("--repeats", type=int, default=3)
    args: Any = parser.parse_args(argv)
    print(run(args.storage, torch.device(args.device), args.tokens, args.repeats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
