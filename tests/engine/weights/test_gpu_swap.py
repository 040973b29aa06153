"""A CUDA swap queues its work without waiting for the device (skipped where there is no CUDA device).

`torch.cuda.set_sync_debug_mode("error")` raises on any synchronizing call (a blocking copy, `.item()`,
`bool(tensor)`): an ordinary LoRA's swap must make none, with pristine copies on the device or in pinned host
memory, once its weights have been touched (the first touch records each weight's max|W|, one read back).
"""

from __future__ import annotations

import pytest
import torch

from engine.caches.store import AdapterStore
from engine.families.sdxl import build_tiny_pipeline
from engine.formats.targets import TargetTable
from engine.weights.swap import ActiveAdapter, WeightPatcher
from serving.demo.synthetic import UNET_ATTENTION, find_targets, make_lora, peft_metadata, save_lora
from tests.support.formats import load

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("pristine", ["cuda", "cpu"], ids=["pristine-on-device", "pristine-pinned-host"])
def test_a_cuda_swap_queues_with_no_sync(tmp_path, pristine):
    device = torch.device("cuda")
    unet = build_tiny_pipeline().unet.to(device, torch.float16)
    table = TargetTable({"unet": unet})
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    store = AdapterStore(
        host_budget=2**30, device_budget=2**30, device=device, dtype=torch.float16, use_device_tier=True
    )
    adapters = []
    for seed in (1, 2):
        path = save_lora(
            tmp_path / f"{seed}.safetensors",
            make_lora(targets, rank=4, seed=seed),
            peft_metadata(targets, rank=4, alpha=4),
        )
        adapters.append(store.for_compute(store.add(load(path, table))))
    patcher = WeightPatcher(table.params, torch.device(pristine), pin=pristine == "cpu")
    before = [p.detach().clone() for p in table.params]
    patcher.apply([ActiveAdapter(adapters[0], 1.0)])  # the first touch: pristine copies and max|W| recorded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for adapter, scale in ((adapters[1], 0.5), (adapters[0], -1.0), (adapters[1], 1.0)):
            patcher.apply([ActiveAdapter(adapter, scale)])
        patcher.restore_all()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(torch.equal(p, b) for p, b in zip(table.params, before, strict=True))
