"""A GGUF FLUX pool (`MODELS` item `MODEL=BASE@/…/x.gguf`, LoRAs as branches) at start-up and beside an SDXL pool
in bf16: start-up loads it from the file and says so in the status; measured as loaded by the plan; concurrent
clients mixing both pools get exactly the images they get alone, its blocks byte-identical after a run with
refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from engine.errors import LimitExceededError
from engine.pipeline.loading import load_pipeline
from engine.pools.flat import module_bytes
from engine.pools.needs import loaded_need, pipeline_modules
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec
from engine.settings import PoolSetting
from engine.storage import gguf_bytes, linear_sizes
from engine.weights.gguf import GGUFBranchedLinear, stored_values
from engine.weights.quantized import held_branches, stored_bytes
from families.flux import MODEL_ID as FLUX_MODEL_ID
from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from serving.ui.status_text import status_markdown
from tests.support.checks import generate
from tests.support.dit import hub_pools
from tests.support.dit import pool_request as request
from tests.support.flux import write_flux_loras
from tests.support.gguf import Q, write_gguf
from tests.support.loras import kohya_file
from tests.support.mixed import assert_clients_get_what_they_get_alone

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_file(loaded_flux, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny FLUX.1 transformer as a Q8_0 file (norms' linears in F32)."""
    folder = tmp_path_factory.mktemp("gguf-dir")
    return write_gguf(folder / "flux-Q8_0.gguf", loaded_flux.denoiser.state_dict(), Q.Q8_0, plain=("norm.",))


@pytest.fixture(scope="module")
def gguf_settings(base_settings, tiny_flux_dir, gguf_file):
    pool = PoolSetting(str(tiny_flux_dir), FLUX_MODEL_ID, None, str(gguf_file))
    return base_settings.replace(
        pools=(pool,),
        model_id=pool.model_id,
        base_model_id=FLUX_MODEL_ID,
        gguf=pool.gguf,  # as `Settings.from_env` sets the first pool's
        gguf_dir=gguf_file.parent,
        lora_max_rank=8,
    )


@pytest.fixture(scope="module")
def gguf_flux(gguf_settings):
    return load_pipeline(gguf_settings.for_pool(gguf_settings.pools[0]))


def test_start_up_loads_a_models_gguf_item_from_its_file_and_says_so(gguf_settings):
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    pools = build_pools(gguf_settings.replace(local_lora_dir=None), resolver, load_pipeline, warm=False)
    try:
        (pool,) = pools.pools
        loaded = pool.engine.loaded
        assert loaded.storage == "gguf" and loaded.branch_rank == 8
        assert isinstance(loaded.denoiser.x_embedder, GGUFBranchedLinear)
        (status,) = pools.status()
        assert status.engine.storage == "gguf" and status.engine.gguf_types.startswith("Q8_0 (")
        assert "**weights** GGUF Q8_0 (" in status_markdown(status.engine)  # the UI's status panel
        # The plan measures it as loaded, in its own storage: its blocks and branch buffers, no pristine copies of
        # the denoiser.
        need = loaded_need(loaded, rank=8)
        assert (need.storage, need.quant) == ("gguf", "Q8_0")
        assert need.weights == module_bytes(pipeline_modules(loaded))
        encoders = [getattr(loaded.pipe, c) for c in loaded.family.components if c != loaded.family.denoiser]
        assert need.touchable == module_bytes(encoders)
    finally:
        pools.close()


def test_the_plan_sizes_a_gguf_denoiser_from_its_file_s_header_as_it_loads(loaded_flux, gguf_file, gguf_settings):
    """The storage formula over the values the file's header says each type holds (no tensor read), for the
    denoiser the file replaces (its values and linears, as a family declares them), is what loading it takes in
    bf16 (the dtype the plan is made for: a GPU's)."""
    settings = gguf_settings.replace(dtype="bfloat16")
    denoiser = load_pipeline(settings.for_pool(settings.pools[0])).denoiser
    native = loaded_flux.denoiser
    linears = linear_sizes(
        ((n, m.out_features, m.in_features) for n, m in native.named_modules() if isinstance(m, nn.Linear)), None
    )
    values = sum(t.numel() for t in (*native.parameters(), *native.buffers()))
    planned = gguf_bytes(values, linears, 8, stored_values(gguf_file))
    assert planned == module_bytes([denoiser]) - _scales(denoiser)


def _scales(denoiser) -> int:
    """The branches' per-rank scales (float32, a rank's worth a linear: 0.01% of FLUX.1's branch buffers), which
    the formula leaves out."""
    return sum(m.lora_scales.nbytes + m.weight_scale.nbytes for m in denoiser.modules() if hasattr(m, "lora_scales"))


@pytest.fixture(scope="module")
def bf16_sdxl(base_settings):
    return load_pipeline(base_settings.replace(dtype="bfloat16"))


@pytest.fixture(scope="module")
def lora_dir(loaded_flux, loaded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gguf-pool-loras")
    write_flux_loras(loaded_flux.pipe, folder)
    wide = make_flux_lora(flux_layers(loaded_flux.pipe.transformer), rank=16, seed=51, alpha=16.0)
    save_lora(folder / "flux_rank16.safetensors", wide.twin())
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=52))
    return folder


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


def outcome(pools, index: int) -> bytes | str:
    refs = MIXED[index % len(MIXED)]
    try:
        given = request(*(LoraSpec(r, scale=0.5 + 0.25 * (index % 3)) for r in refs), seed=index % 5)
        return generate(pools, given).image.tobytes()
    except LimitExceededError as e:
        return f"refused: {type(e).__name__}"


@pytest.mark.timeout(900)
def test_clients_mixing_a_gguf_flux_and_a_bf16_sdxl_pool_get_exactly_their_own_images(
    bf16_sdxl, gguf_flux, base_settings, clean_hub, lora_dir
):
    before = stored_bytes(gguf_flux.denoiser)
    pipelines = [(bf16_sdxl, base_settings.base_model_id), (gguf_flux, FLUX_MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as pools:
        alone = assert_clients_get_what_they_get_alone(lambda index: outcome(pools, index), 16, clients=4)
        assert alone.count("refused: LimitExceededError") == 2
        assert stored_bytes(gguf_flux.denoiser) == before
        (flux_pool,) = [pool for pool in pools.pools if pool.engine.loaded is gguf_flux]
        flux_pool.engine.restore_base_weights()
    assert held_branches(gguf_flux.denoiser) == []
