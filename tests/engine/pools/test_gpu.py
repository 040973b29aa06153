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
from tests.support.dit import assert_swaps_exact
from tests.support.images import assert_images_close

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


def test_cuda_samplers_clip_skip_and_batches_leave_the_pool_as_it_was(cuda_loaded, base_settings, hub):
    """Per-request samplers on a CUDA pool: the scheduler object untouched, the default image the same after;
    a batch of four within 2 levels of each seed alone (fp16 batches round differently)."""
    settings = base_settings.replace(device="cuda", dtype="float16")
    resolver = AdapterResolver(HubSource(endpoint=hub.url), local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(cuda_loaded, settings, resolver)
    scheduler = cuda_loaded.pipe.scheduler
    plain = generate(engine, GenerateRequest("a fox", steps=4, seed=3)).image
    for name in ("DPM++ 2M Karras", "LCM", "Euler a"):
        generate(engine, GenerateRequest("a fox", steps=4, seed=3, scheduler=name, clip_skip=1))
    assert cuda_loaded.pipe.scheduler is scheduler
    assert generate(engine, GenerateRequest("a fox", steps=4, seed=3)).image.tobytes() == plain.tobytes()
    batch = generate(engine, GenerateRequest("a fox", steps=4, seed=10, num_images=4, scheduler="Euler a"))
    for seed, image in zip(batch.seeds, batch.images, strict=True):
        alone = generate(engine, GenerateRequest("a fox", steps=4, seed=seed, scheduler="Euler a")).image
        assert_images_close(image, alone, seed)


@pytest.mark.parametrize("gpu_mode", ["persistent", "per_call"])
def test_cuda_flux_swaps_are_exact_in_bfloat16(tiny_flux_dir, base_settings, tmp_path, gpu_mode):
    """DTYPE=auto loads FLUX in bfloat16 on a GPU (its activations overflow float16); every naming swaps in and
    out exactly there."""
    from families.flux import MODEL_ID as FLUX_MODEL_ID
    from tests.support.flux import CASES, write_flux_loras

    settings = base_settings.replace(
        model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID, device="cuda", dtype="auto", gpu_mode=gpu_mode
    )
    loaded = load_pipeline(settings)
    assert loaded.dtype == torch.bfloat16
    write_flux_loras(loaded.pipe, tmp_path)
    assert_swaps_exact(loaded, settings, tmp_path, CASES)


@pytest.mark.parametrize("gpu_mode", ["persistent", "per_call"])
def test_cuda_zimage_swaps_are_exact_in_bfloat16(tiny_zimage_dir, base_settings, tmp_path, gpu_mode):
    """DTYPE=auto loads Z-Image in bfloat16 on a GPU (the precision it was trained in); every naming swaps in and
    out exactly there."""
    from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
    from tests.support.zimage import CASES, write_zimage_loras

    settings = base_settings.replace(
        model_id=str(tiny_zimage_dir), base_model_id=ZIMAGE_MODEL_ID, device="cuda", dtype="auto", gpu_mode=gpu_mode
    )
    loaded = load_pipeline(settings)
    assert loaded.dtype == torch.bfloat16
    write_zimage_loras(loaded.pipe, tmp_path)
    assert_swaps_exact(loaded, settings, tmp_path, CASES)


@pytest.mark.parametrize("gpu_mode", ["persistent", "per_call"])
def test_cuda_flux2_swaps_are_exact_in_bfloat16(tiny_flux2_dir, base_settings, tmp_path, gpu_mode):
    """DTYPE=auto loads FLUX.2 [klein] in bfloat16 on a GPU; every naming swaps in and out exactly there."""
    from families.flux2 import MODEL_ID
    from tests.support.flux2 import CASES, write_flux2_loras

    settings = base_settings.replace(
        model_id=str(tiny_flux2_dir), base_model_id=MODEL_ID, device="cuda", dtype="auto", gpu_mode=gpu_mode
    )
    loaded = load_pipeline(settings)
    assert loaded.dtype == torch.bfloat16
    write_flux2_loras(loaded.pipe, tmp_path)
    assert_swaps_exact(loaded, settings, tmp_path, CASES)
