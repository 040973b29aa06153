"""A quantized FLUX pool (fp8, LoRAs as branches) beside an SDXL pool in bf16: concurrent clients mixing both get
exactly the images they get alone, and the FLUX pool's stored weights are byte-identical after a run with
failures, its branches all zero once its base is restored; the fp8 need's count of what its formula
widens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.errors import LimitExceededError
from engine.families.registry import served_specs
from engine.pipeline.loading import load_pipeline
from engine.pools.flat import module_bytes
from engine.pools.needs import loaded_need, pipeline_modules
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec
from engine.settings import PoolSetting, Settings
from engine.weights.quantized import DEQUANTIZED_COPIES, BranchedLinear, held_branches, stored_bytes
from families.flux import MODEL_ID as FLUX_MODEL_ID
from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support.checks import generate
from tests.support.dit import hub_pools, needs_on_a_gpu
from tests.support.dit import pool_request as request
from tests.support.flux import write_flux_loras
from tests.support.loras import kohya_file
from tests.support.mixed import assert_clients_get_what_they_get_alone

pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def fp8_flux(base_settings, tiny_flux_dir):
    settings = base_settings.replace(
        model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID, quantize="fp8", lora_max_rank=8
    )
    return load_pipeline(settings)


@pytest.fixture(scope="module")
def bf16_sdxl(base_settings):
    return load_pipeline(base_settings.replace(dtype="bfloat16"))


@pytest.fixture(scope="module")
def lora_dir(fp8_flux, loaded_flux, loaded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("quantized-pool-loras")
    write_flux_loras(loaded_flux.pipe, folder)
    wide = make_flux_lora(flux_layers(loaded_flux.pipe.transformer), rank=16, seed=51, alpha=16.0)
    save_lora(folder / "flux_rank16.safetensors", wide.twin())
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=52))
    return folder


@pytest.fixture
def pools(bf16_sdxl, fp8_flux, base_settings, clean_hub, lora_dir):
    pipelines = [(bf16_sdxl, base_settings.base_model_id), (fp8_flux, FLUX_MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as made:
        yield made


MIXED = (
    ("local:flux_kohya_linear1.safetensors",),
    ("local:sdxl_kohya.safetensors",),
    ("local:flux_xlabs.safetensors",),
    (),
    ("local:flux_comfy.safetensors", "local:flux_peft.safetensors"),
    ("local:sdxl_kohya.safetensors",),
    ("local:flux_peft.safetensors",),
    ("local:flux_rank16.safetensors",),  # over LORA_MAX_RANK=8: refused, the others go on
)


def mixed(index: int):
    refs = MIXED[index % len(MIXED)]
    return request(*(LoraSpec(r, scale=0.5 + 0.25 * (index % 3)) for r in refs), seed=index % 5)


def outcome(pools, index: int) -> bytes | str:
    try:
        return generate(pools, mixed(index)).image.tobytes()
    except LimitExceededError as e:
        return f"refused: {type(e).__name__}"


@pytest.mark.timeout(900)
def test_clients_mixing_a_quantized_flux_and_a_bf16_sdxl_pool_get_exactly_their_own_images(pools, fp8_flux):
    before = stored_bytes(fp8_flux.pipe.transformer)
    alone = assert_clients_get_what_they_get_alone(lambda index: outcome(pools, index), 16, clients=4)
    assert alone.count("refused: LimitExceededError") == 2
    assert stored_bytes(fp8_flux.pipe.transformer) == before
    (flux_pool,) = [pool for pool in pools.pools if pool.engine.loaded is fp8_flux]
    flux_pool.engine.restore_base_weights()
    assert held_branches(fp8_flux.pipe.transformer) == []


def test_start_up_with_quantize_fp8_loads_the_denoiser_quantized_and_says_so(base_settings, tiny_flux_dir):
    """No plan before loading (a tiny pipeline on the CPU): QUANTIZE=fp8 itself quantizes the pool as it loads."""
    settings = base_settings.replace(
        model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID, quantize="fp8", lora_max_rank=4, local_lora_dir=None
    )
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    pools = build_pools(settings, resolver, load_pipeline, warm=False)
    try:
        (pool,) = pools.pools
        assert pool.engine.loaded.storage == "fp8" and pool.engine.loaded.branch_rank == 4
        assert isinstance(pool.engine.loaded.denoiser.x_embedder, BranchedLinear)
        (status,) = pools.status()
        assert status.engine.storage == "fp8"
    finally:
        pools.close()


def test_a_pool_loaded_in_fp8_is_measured_as_it_is(fp8_flux):
    """Its branch buffers are module bytes already: the plan's fp8 alternative must not add them again."""
    need = loaded_need(fp8_flux, rank=8)
    denoiser = module_bytes([fp8_flux.denoiser])
    assert need.fp8 is not None
    assert need.fp8.weights == module_bytes(pipeline_modules(fp8_flux))
    assert need.fp8.touchable == need.touchable - denoiser


def test_the_fp8_need_counts_the_weight_its_formula_widens_at_each_call(fp8_flux, loaded_flux):
    """Eager on a GPU, an fp8 denoiser widens each weight to the compute dtype at each call (`DEQUANTIZED_COPIES`
    transient copies, freed after its matmul): the fp8 need's working memory counts its largest Linear's, measured
    on a loaded pool (in fp8 or not), or bounded by the family's `largest_values` before loading."""
    widest = max(m.weight.numel() for m in loaded_flux.denoiser.modules() if isinstance(m, nn.Linear))
    for loaded in (loaded_flux, fp8_flux):
        need = loaded_need(loaded, rank=8)
        assert need.fp8 is not None and loaded.dtype == torch.float32
        assert need.fp8.working - need.working == DEQUANTIZED_COPIES * widest * 4
    declared = [spec for spec in served_specs() if spec.memory.linears is not None]
    assert len(declared) >= 5
    for spec in declared:
        model = spec.identity.model_id
        settings = Settings(dtype="auto", device="cpu", pools=(PoolSetting(model, model),), host_ram_bytes=2**40)
        (need,) = needs_on_a_gpu(settings)
        itemsize = torch.empty((), dtype=getattr(torch, spec.half_dtype)).element_size()
        assert need.fp8 is not None and spec.memory.largest_values > 0
        assert need.fp8.working - need.working == DEQUANTIZED_COPIES * spec.memory.largest_values * itemsize
