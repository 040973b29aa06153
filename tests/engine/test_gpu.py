"""The engine on a CUDA device (skipped where there is none): both GPU modes, exact restores."""

from __future__ import annotations

import pytest
import torch

from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.hub import HubSource
from tests.support.checks import generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def cuda_loaded(base_settings):
    return load_pipeline(base_settings.replace(device="cuda", dtype="float16"))


@pytest.mark.parametrize("gpu_mode", ["persistent", "per_call"])
def test_cuda_swaps_are_exact_in_both_gpu_modes(cuda_loaded, base_settings, hub, fixtures, gpu_mode):
    settings = base_settings.replace(device="cuda", dtype="float16", gpu_mode=gpu_mode)
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url), local_dir=settings.local_lora_dir, token=None, max_bytes=2**30
    )
    engine = Engine(cuda_loaded, settings, resolver)
    unet = cuda_loaded.pipe.unet
    before = {k: v.clone() for k, v in unet.state_dict().items()}
    base = generate(engine, GenerateRequest("a fox", steps=2, seed=1)).image
    for scale in (0.5, 1.0, -0.5):
        lora = generate(
            engine, GenerateRequest("a fox", loras=(LoraSpec(fixtures["peft"], scale=scale),), steps=2, seed=1)
        )
        assert lora.image.tobytes() != base.tobytes()
    engine.restore_base_weights()
    assert all(torch.equal(v, before[k]) for k, v in unet.state_dict().items())
    assert generate(engine, GenerateRequest("a fox", steps=2, seed=1)).image.tobytes() == base.tobytes()
