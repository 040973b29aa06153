"""Where pristine copies should live: the cost of one restore from host RAM vs from the compute device.

`python -m bench.pristine --device cuda` allocates the weights of SDXL's 560 UNet attention projections
(the weights a typical LoRA touches; shapes from diffusers' own UNet config, built on the meta device), and
times the swap's restore (`copy_` of every touched weight from its pristine copy) from a pinned host copy
and from a device copy, side by side in one run. On a CPU-only machine only the host restore is measured.

A quantized pool (`QUANTIZE=fp8`) restores otherwise: its stored weights are never written, and taking a LoRA out
zeroes the low-rank branch buffers beside them (`engine.weights.quantized.BranchedLinear.load_branch([])`). So
the same projections are also stored in fp8 with branches of `--branch-rank` (`LORA_MAX_RANK`'s default, 128),
each made to hold a LoRA of half that rank, and that clearing is timed; after each, every branch buffer must be
zero and every stored byte as quantized (`branch_zero`). `--branch-rank 0` (or no torchao) skips it.
It ends with one line: `pristine_restore_host_ms=<ms> device_ms=<ms|n/a> host_vs_device=<ratio|n/a> bytes=<n>
branch_restore_ms=<ms|n/a> branch_zero=<true|false|n/a>`.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import time
from collections.abc import Sequence

import torch
from diffusers import UNet2DConditionModel
from torch import nn

from .sdxl_unet import SDXL_UNET_CONFIG

_ATTENTION = re.compile(r"attn[12]\.(to_q|to_k|to_v|to_out\.0)$")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def attention_shapes() -> list[torch.Size]:
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(dict(SDXL_UNET_CONFIG))
    return [m.weight.shape for name, m in unet.named_modules() if _ATTENTION.search(name)]


def _restore_ms(weights: list[torch.Tensor], copies: list[torch.Tensor], repeats: int) -> float:
    device = weights[0].device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync()
        started = time.perf_counter()
        for weight, copy in zip(weights, copies, strict=True):
            weight.copy_(copy, non_blocking=True)
        sync()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[1:])


def _branch_restore(weights: list[torch.Tensor], rank: int, repeats: int) -> tuple[float, bool]:
    """(median ms to clear every branch holding a LoRA of `rank // 2`, whether every branch buffer was zero and
    every stored byte unchanged after each clear) over the projections stored in fp8 with branches of `rank`."""
    from engine.weights.quantized import BranchedLinear, stored_bytes

    modules = nn.ModuleList()
    for weight in weights:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        modules.append(BranchedLinear(linear, rank, weight.dtype))
    stored = stored_bytes(modules)
    generator = torch.Generator().manual_seed(0)
    held = [
        [
            (
                torch.randn(rank // 2, m.in_features, generator=generator),
                torch.randn(m.out_features, rank // 2, generator=generator),
                0.5,
            )
        ]
        for m in modules
    ]
    device = weights[0].device
    times, zero = [], True
    for _ in range(repeats + 1):  # the first is a warm-up
        for module, parts in zip(modules, held, strict=True):
            module.load_branch([(down.to(device), up.to(device), scale) for down, up, scale in parts])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for module in modules:
            module.load_branch([])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
        zero = zero and all(
            m.branch_rank == 0 and not any(bool(b.any()) for b in (m.lora_down, m.lora_up, m.lora_scales))
            for m in modules
        )
    return statistics.median(times[1:]), zero and stored_bytes(modules) == stored


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float16", choices=sorted(_DTYPES))
    parser.add_argument("--fraction", type=float, default=1.0, help="share of the 560 projections to use")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--branch-rank", type=int, default=128, help="a quantized pool's branch rank (0: skip)")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), _DTYPES[args.dtype]
    shapes = attention_shapes()
    shapes = shapes[: max(1, round(len(shapes) * args.fraction))]
    weights = [torch.randn(s, dtype=torch.float32).to(device=device, dtype=dtype) for s in shapes]
    nbytes = sum(w.nbytes for w in weights)
    pin = device.type == "cuda"
    host = [w.detach().to("cpu", copy=True) for w in weights]
    host = [h.pin_memory() for h in host] if pin else host
    host_ms = _restore_ms(weights, host, args.repeats)
    device_ms: float | None = None
    if device.type != "cpu":
        on_device = [w.detach().clone() for w in weights]
        device_ms = _restore_ms(weights, on_device, args.repeats)
    print(f"{len(shapes)} attention projections, {nbytes / 2**20:.0f} MiB in {args.dtype} on {device}")
    print(f"restore from {'pinned ' if pin else ''}host RAM: {host_ms:.1f} ms ({nbytes / host_ms / 1e6:.1f} GB/s)")
    if device_ms is not None:
        print(f"restore from device memory: {device_ms:.1f} ms ({nbytes / device_ms / 1e6:.1f} GB/s)")
    branch_text, zero_text = "n/a", "n/a"
    if args.branch_rank > 0 and importlib.util.find_spec("torchao") is not None:
        branch_ms, zero = _branch_restore(weights, args.branch_rank, args.repeats)
        branch_text, zero_text = f"{branch_ms:.1f}", str(zero).lower()
        held = args.branch_rank // 2
        print(f"clearing fp8 branches of rank {args.branch_rank} holding rank {held}: {branch_text} ms")
    ratio = f"{host_ms / device_ms:.1f}" if device_ms else "n/a"
    device_text = f"{device_ms:.1f}" if device_ms is not None else "n/a"
    print(
        f"pristine_restore_host_ms={host_ms:.1f} device_ms={device_text} host_vs_device={ratio} bytes={nbytes} "
        f"branch_restore_ms={branch_text} branch_zero={zero_text}"
    )


if __name__ == "__main__":
    main()
