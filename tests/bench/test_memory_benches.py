"""The memory benchmarks' parts on small models: bringing a pool back (bench.pools), fp8 storage (bench.fp8)."""

from __future__ import annotations

import torch

from bench.fp8 import kept
from bench.pools import measure
from bench.sdxl_unet import build_sdxl_unet, mismatched_tensors, random_pool
from engine.families.sdxl import build_tiny_pipeline


def test_bringing_a_tiny_unet_back_times_all_three_moves_and_stays_exact():
    pool = random_pool(seed=5, size=1 << 18)
    unet = build_sdxl_unet(dtype=torch.bfloat16, pool=pool, config=dict(build_tiny_pipeline().unet.config))
    row = measure("tiny", unet, pool, repeats=2, device=torch.device("cpu"))
    assert row["exact"] is True and mismatched_tensors(unet, pool) == []
    assert row["tensors"] == len(list(unet.parameters())) + len(list(unet.buffers()))
    assert min(row["ours_s"], row["floor_s"], row["old_s"]) > 0 and row["ratio"] > 0 and row["basis"] == "cpu"


def test_fusing_into_fp8_keeps_far_less_of_a_lora_than_16_bit_storage():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 256, generator=generator) * 0.02
    delta = torch.randn(256, 4, generator=generator) @ torch.randn(4, 256, generator=generator)
    delta *= 0.03 * weight.norm() / delta.norm()
    errors = {dtype: kept(weight, delta, dtype)[0] for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn)}
    assert errors[torch.float16] < errors[torch.bfloat16] < 0.2 < 0.5 < errors[torch.float8_e4m3fn]
