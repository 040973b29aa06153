"""Where pristine copies should live: the cost of one restore from host RAM vs from the compute device.

`python -m bench.pristine --device cuda` allocates the weights of SDXL's 560 UNet attention projections
(the weights a typical LoRA touches; shapes from diffusers' own UNet config, built on the meta device), and
times the swap's restore (`copy_` of every touched weight from its pristine copy) from a pinned host copy
and from a device copy, side by side in one run. On a CPU-only machine only the host restore is measured.
It ends with one line: `pristine_restore_host_ms=<ms> device_ms=<ms|n/a> host_vs_device=<ratio|n/a> bytes=<n>`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Sequence

import torch
from diffusers import UNet2DConditionModel

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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float16", choices=sorted(_DTYPES))
    parser.add_argument("--fraction", type=float, default=1.0, help="share of the 560 projections to use")
    parser.add_argument("--repeats", type=int, default=5)
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
    ratio = f"{host_ms / device_ms:.1f}" if device_ms else "n/a"
    device_text = f"{device_ms:.1f}" if device_ms is not None else "n/a"
    print(f"pristine_restore_host_ms={host_ms:.1f} device_ms={device_text} host_vs_device={ratio} bytes={nbytes}")


if __name__ == "__main__":
    main()
