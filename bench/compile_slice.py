"""A real-width slice of SDXL's denoiser for the compile benchmark on a CPU: its middle block, at 1024².

The tiny pipelines say whether compiling keeps swaps exact, not what it gains on real widths: this slice is SDXL's
`UNetMidBlock2DCrossAttn` at full width (1280 channels, 20 heads of 64, cross-attention 2048, two ResNet blocks) with
one transformer layer of its ten, on the latents of a 1024² image with guidance (2 × 1280 × 32 × 32). It is compiled
as a pool's denoiser is (`engine.pipeline.compiled.compile_denoiser`), then swapped with the engine's own swap
(`bench.ours.Ours`: PEFT LoRAs of ranks 4, 32 and 128 on its attention, alone, at other scales and several at once),
each swap checked against the eager output. It makes no image, so its difference is given in 8-bit levels of its
output's range (the scale an image's difference is counted on).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
from diffusers.models.unets.unet_2d_blocks import UNetMidBlock2DCrossAttn
from torch import nn

from bench.measure import Clock
from bench.ours import Ours, write_pair
from bench.sdxl_unet import SDXL_UNET_CONFIG
from engine.pipeline.compiled import compile_denoiser, dynamo_compiles
from engine.weights.swap import ActiveAdapter
from serving.demo.synthetic import UNET_ATTENTION, find_targets

__all__ = ["SDXLMiddle", "measure_slice"]

_RANKS = (4, 32, 128)


class SDXLMiddle(nn.Module):
    """SDXL's middle block with one transformer layer, under the name it has in the UNet (LoRA names match)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = dict(SDXL_UNET_CONFIG)
        self.mid_block = UNetMidBlock2DCrossAttn(
            in_channels=1280,
            temb_channels=1280,
            transformer_layers_per_block=1,
            num_attention_heads=20,
            cross_attention_dim=2048,
            use_linear_projection=True,
            resnet_groups=32,
        )

    def forward(self, sample: torch.Tensor, temb: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.mid_block(sample, temb, encoder_hidden_states=encoder_hidden_states)


def measure_slice(
    mode: str,
    repeats: int,
    swaps: int,
    workdir: Path,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    middle = SDXLMiddle().eval().to(device=device, dtype=dtype)
    for parameter in middle.parameters():
        parameter.requires_grad_(False)
    inputs = tuple(
        t.to(device=device, dtype=dtype)
        for t in (torch.randn(2, 1280, 32, 32), torch.randn(2, 1280), torch.randn(2, 77, 2048))
    )
    folder = workdir / "slice"
    folder.mkdir(parents=True, exist_ok=True)
    targets = find_targets({"unet": middle}, {"unet": UNET_ATTENTION})
    ours = Ours(middle, device=device, dtype=dtype, max_rank=128, cache_bytes=2**31)
    adapters = [
        ours.prepare(path, f"r{rank}-{index}")
        for rank in _RANKS
        for index, path in enumerate(write_pair(folder, targets, rank=rank, fmt="peft").paths)
    ]
    sets = [((a, 1.0),) for a in adapters] + [
        ((adapters[0], 0.5), (adapters[3], -0.8)),
        ((adapters[1], 0.7), (adapters[2], 0.3), (adapters[5], 1.0)),
        (),
    ]
    with torch.inference_mode():
        compiled = compile_denoiser(middle, mode, [(1024, 1024)], lambda w, h: middle(*inputs))
        compiles, diff_levels = dynamo_compiles(), 0.0
        for index in range(swaps):
            chosen = sets[index % len(sets)]
            ours.patcher.apply(tuple(ActiveAdapter(ours.store.for_compute(a), s) for a, s in chosen))
            out, eager = compiled(*inputs), compiled.eager(*inputs)
            span = float(eager.float().max() - eager.float().min())
            diff_levels = max(diff_levels, float((out.float() - eager.float()).abs().max()) / span * 255)
        recompiles = dynamo_compiles() - compiles + compiled.recompiles
        clock = Clock(device)
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(repeats):
            for name, call in (("eager", compiled.eager), ("compiled", compiled)):
                started = clock()
                call(*inputs)
                times[name].append(clock() - started)
    ours.reset()
    eager_s, compiled_s = statistics.median(times["eager"]), statistics.median(times["compiled"])
    return {
        "family": "sdxl-slice",
        "model": "SDXL middle block, 1 of 10 transformer layers, random weights",
        "device": str(device),
        "mode": mode,
        "size": [1024, 1024],
        "swaps": swaps,
        "eager_step_s": eager_s,
        "compiled_step_s": compiled_s,
        "step_speedup": eager_s / compiled_s,
        "compile_s": compiled.compile_s,
        "recompiles_after_swaps": recompiles,
        "eager_calls": compiled.eager_calls,
        "max_diff_vs_eager": diff_levels,
        "compiled_calls": compiled.compiled_calls,
    }
