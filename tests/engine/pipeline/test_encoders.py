"""Text encoders left in host RAM: computed on the GPU with their weights streamed in (not on the host's CPU),
and their outputs for recent prompts kept (issue 29 §4.9). The image is the pipeline's own either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from engine.pipeline import encoders
from engine.pipeline.encoders import CachedEncoder, run_from_host_ram
from engine.pipeline.loading import load_pipeline
from families.flux import MODEL_ID as FLUX_MODEL_ID


def _image(loaded, prompt: str = "a fox in a forest") -> np.ndarray:
    generator = torch.Generator("cpu").manual_seed(7)
    out = loaded.pipe(prompt=prompt, num_inference_steps=2, width=64, height=64, generator=generator)
    return np.asarray(out.images[0], dtype=np.int16)


def _counting(module: nn.Module) -> list[int]:
    """Calls that reached the module's own computation (a hit never does)."""
    calls: list[int] = []
    module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.fixture(scope="module")
def hosted(tiny_flux_dir, base_settings):
    settings = base_settings.replace(model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID)
    return load_pipeline(settings, host_components=("text_encoder_2",))


def test_a_prompt_seen_before_is_not_encoded_again_and_gives_the_same_image(hosted, loaded_flux):
    t5 = hosted.pipe.text_encoder_2
    assert isinstance(t5.__dict__.get("forward"), CachedEncoder)
    calls = _counting(t5.encoder)
    first = _image(hosted)
    assert len(calls) == 1
    again = _image(hosted)
    assert len(calls) == 1  # the cached output, not T5 again
    assert np.array_equal(again, first)
    assert np.array_equal(first, _image(loaded_flux))  # the pool with T5 on its device, uncached
    _image(hosted, "a fox in the snow")
    assert len(calls) == 2  # another prompt is encoded


def test_a_hit_hands_back_new_tensors_equal_to_the_encoders_own_output():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
    cached = CachedEncoder.install(module, max_bytes=2**20)
    ids = torch.tensor([[1, 2, 3]])
    expected = cached._forward(ids)
    first, second = module(ids), module(ids)
    assert cached.misses == 1 and cached.hits == 1
    assert torch.equal(first, expected) and torch.equal(second, expected)
    second.add_(1)  # a caller writing into what it got changes nothing kept
    assert torch.equal(module(ids), expected)
    module(torch.tensor([[1, 2, 4]]))
    assert cached.misses == 2


def test_the_cache_is_bounded_in_bytes():
    module = nn.Linear(4, 256)
    cached = CachedEncoder.install(module, max_bytes=3 * 256 * 4)
    for i in range(10):
        module(torch.full((1, 4), float(i)))
    assert cached._cache.currsize <= 3 * 256 * 4 and len(cached._cache) == 3


def test_on_a_cuda_device_the_weights_are_streamed_in_not_computed_on(monkeypatch):
    # A fake CUDA device: what is asked of diffusers' group offloading (a GPU run is the test below).
    import diffusers.hooks

    asked: list[dict[str, object]] = []
    monkeypatch.setattr(diffusers.hooks, "apply_group_offloading", lambda module, **kw: asked.append(kw))
    module = nn.Linear(2, 2)
    run_from_host_ram(module, torch.device("cuda", 0), cache_bytes=encoders.ENCODER_CACHE_BYTES)
    (options,) = asked
    assert options["onload_device"] == torch.device("cuda", 0) and options["offload_device"] == torch.device("cpu")
    assert options["use_stream"] is True
    assert not module._forward_pre_hooks  # no host-RAM compute hooks
    assert isinstance(module.__dict__["forward"], CachedEncoder)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_t5_in_host_ram_computes_on_the_gpu(tiny_flux_dir, base_settings):
    settings = base_settings.replace(
        model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID, device="cuda", dtype="auto"
    )
    gpu_hosted = load_pipeline(settings, host_components=("text_encoder_2",))
    t5 = gpu_hosted.pipe.text_encoder_2
    seen: list[str] = []
    layer = next(m for m in t5.modules() if isinstance(m, nn.Linear))
    layer.register_forward_pre_hook(lambda module, args: seen.append(module.weight.device.type))
    _image(gpu_hosted)
    assert seen and set(seen) == {"cuda"}
    # Between calls its weights wait in host RAM: the plan's bytes stay off the device.
    assert all(p.device.type == "cpu" for p in t5.parameters())
