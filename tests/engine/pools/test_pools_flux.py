"""A FLUX pool beside an SDXL one: routing by a FLUX LoRA's card, metadata or names; concurrent clients mixing
FLUX and SDXL LoRAs each getting exactly their own image; both bases bit-exact after a mixed run with failures;
and every transport (POST /models/<FLUX>, POST / with a FLUX LoRA, a comparison) reaching the FLUX pool."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from diffusers import FluxTransformer2DModel

from engine.compare import CompareRequest
from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.requests import GenerateRequest, LoraSpec
from families.flux import MODEL_ID as FLUX_MODEL_ID
from serving.backends import blocking
from serving.demo.synthetic import kohya_metadata, save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from serving.ui.pool_views import pools_status_json
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of, generate
from tests.support.dit import assert_components_pristine, hub_pools, pool_of, response_image
from tests.support.dit import pool_request as request
from tests.support.flux import write_flux_loras
from tests.support.loras import SD15, SDXL, card, kohya_file, peft_file, sft
from tests.support.mixed import assert_mixed_clients_get_their_own_images
from tests.support.mixed import mixed_request as mixed


@pytest.fixture(scope="module")
def lora_dir(loaded, loaded_flux, hub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("flux-pool-loras")
    flux = write_flux_loras(loaded_flux.pipe, folder)
    # Metadata alone: kohya's FLUX metadata (ss_base_model_version flux1) over BFL names, no card.
    kohya, _ = make_flux_lora(flux_layers(loaded_flux.pipe.transformer), rank=4, seed=31, alpha=2.0).file("kohya")
    save_lora(folder / "flux_meta.safetensors", kohya, kohya_metadata(dim=4, alpha=2.0, base_version="flux1"))
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=32))
    assert {"xlabs", "comfy_linear1", "peft"} <= set(flux)
    # By card: a FLUX LoRA, one made for a wider FLUX (its shapes fit nothing served), an SDXL and an SD 1.5 one.
    hub.add_repo("flux-pools/flux-card", {"README.md": card(FLUX_MODEL_ID), "lora.safetensors": sft(twin(loaded_flux))})
    with torch.device("meta"):
        wider = FluxTransformer2DModel(num_layers=1, num_single_layers=1, num_attention_heads=3, attention_head_dim=16)
    wide = make_flux_lora(flux_layers(wider), rank=2, seed=33).twin()
    hub.add_repo("flux-pools/flux-wide", {"README.md": card(FLUX_MODEL_ID), "lora.safetensors": sft(wide)})
    hub.add_repo("flux-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(loaded.pipe, seed=34)})
    hub.add_repo("flux-pools/sd15-card", {"README.md": card(SD15), "lora.safetensors": peft_file(loaded.pipe, seed=35)})
    return folder


def twin(loaded_flux) -> dict[str, torch.Tensor]:
    layers = flux_layers(loaded_flux.pipe.transformer, loaded_flux.pipe.text_encoder)
    return make_flux_lora(layers, rank=4, seed=36, strength=1.0).twin()


@pytest.fixture
def pools(loaded, loaded_flux, base_settings, clean_hub, lora_dir):
    pipelines = [(loaded, base_settings.base_model_id), (loaded_flux, FLUX_MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as made:
        yield made


def test_a_flux_lora_goes_to_the_flux_pool_by_its_card_its_metadata_or_its_names(pools):
    assert pool_of(pools, "flux-pools/flux-card") == FLUX_MODEL_ID
    assert pool_of(pools, "local:flux_meta.safetensors") == FLUX_MODEL_ID
    for name in ("peft", "kohya", "kohya_linear1", "comfy", "xlabs"):
        assert pool_of(pools, f"local:flux_{name}.safetensors") == FLUX_MODEL_ID, name
    assert pool_of(pools, "flux-pools/sdxl-card", "local:sdxl_kohya.safetensors") == SDXL
    result = generate(pools, request(LoraSpec("local:flux_kohya_linear1.safetensors")))
    assert result.image.size == (64, 64) and result.adapters[0].ref == "local:flux_kohya_linear1.safetensors"


def test_a_flux_lora_and_an_sdxl_lora_in_one_request_are_refused_naming_each_base(pools):
    with pytest.raises(InvalidRequestError, match=r"share one base model") as caught:
        generate(pools, request(LoraSpec("flux-pools/flux-card"), LoraSpec("flux-pools/sdxl-card")))
    assert f"'flux-pools/flux-card' is for {FLUX_MODEL_ID}" in str(caught.value)


MIXED = (
    (),
    ("local:flux_kohya_linear1.safetensors",),
    ("flux-pools/sdxl-card",),
    ("local:flux_xlabs.safetensors",),
    ("local:sdxl_kohya.safetensors",),
    ("flux-pools/flux-card",),
    ("local:flux_comfy.safetensors", "local:flux_peft.safetensors"),
    ("local:flux_meta.safetensors",),
)


def mixed_request(index: int) -> tuple[GenerateRequest, str]:
    return mixed(MIXED, FLUX_MODEL_ID, index)


@pytest.mark.timeout(900)
def test_eight_clients_mixing_flux_and_sdxl_loras_get_exactly_their_own_images(pools):
    assert_mixed_clients_get_their_own_images(pools, [mixed_request(i) for i in range(24)])


@pytest.mark.timeout(900)
def test_both_bases_are_bit_exact_after_a_mixed_run_with_failures(pools, loaded, loaded_flux, pristine, pristine_flux):
    base_images = [generate(pools, request(), base=b).image.tobytes() for b in (SDXL, FLUX_MODEL_ID)]
    rng = np.random.default_rng(5)
    for step in range(24):
        mixed, base = mixed_request(int(rng.integers(0, 1000)))
        generate(pools, dataclasses.replace(mixed, steps=1), base=base)
        if step % 6 == 2:
            with pytest.raises(IncompatibleLoraError, match=r"do not fit"):
                generate(pools, request(LoraSpec("flux-pools/flux-wide")))
        if step % 6 == 5:
            with pytest.raises(InvalidRequestError):
                generate(pools, request(LoraSpec("flux-pools/flux-card"), LoraSpec("flux-pools/sdxl-card")))
    for pool in pools.pools:
        pool.engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))
    assert_components_pristine(loaded_flux.pipe, pristine_flux, ("transformer", "text_encoder", "text_encoder_2"))
    assert [generate(pools, request(), base=b).image.tobytes() for b in (SDXL, FLUX_MODEL_ID)] == base_images


def test_every_transport_reaches_the_flux_pool(pools):
    backend = backend_of(pools)
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    png = {"accept": "image/png"}
    with serve_routes(backend) as url:
        named = httpx.post(f"{url}models/{FLUX_MODEL_ID}", content=body, headers=png, timeout=120)
        assert named.status_code == 200, named.text[:300]
        assert response_image(named) == generate(pools, request(), base=FLUX_MODEL_ID).image.tobytes()
        by_base = httpx.post(url, content=body, headers={"lora": "flux-pools/flux-card", **png}, timeout=120)
        assert by_base.status_code == 200, by_base.text[:300]
        assert response_image(by_base) == generate(pools, request(LoraSpec("flux-pools/flux-card"))).image.tobytes()
        wide = httpx.post(url, content=body, headers={"lora": "flux-pools/flux-wide"}, timeout=120)
        assert wide.status_code == 400 and wide.json()["error_type"] == "IncompatibleLoraError"
        assert "do not fit transformer." in wide.json()["error"] and "(32, 32)" in wide.json()["error"]
        unserved = httpx.post(url, content=body, headers={"lora": "flux-pools/sd15-card"}, timeout=120)
        assert unserved.status_code == 404 and unserved.json()["error_type"] == "UnservedBaseError"
        assert f"served: {SDXL} (sdxl), {FLUX_MODEL_ID} (flux)" in unserved.json()["error"]
        sixteen = '{"inputs": "a fox", "parameters": {"width": 66}}'
        odd = httpx.post(f"{url}models/{FLUX_MODEL_ID}", content=sixteen, timeout=120)
        assert odd.status_code == 400 and "not a multiple of 4" in odd.json()["error"]
    xlabs = "local:flux_xlabs.safetensors"
    grid = blocking(
        backend.compare(
            CompareRequest(prompt="a fox in a forest", loras=(LoraSpec(xlabs),), scales=(0.5, 1.0), steps=2, seed=7)
        )
    )
    assert [r.request.width for r in grid.results] == [64, 64]
    alone = generate(pools, request(LoraSpec(xlabs, scale=1.0)))
    assert grid.results[1].image.tobytes() == alone.image.tobytes()
    # The API says which inputs each pool reads: SDXL's classifier-free guidance, FLUX.1 [dev]'s distilled one.
    status = pools_status_json(blocking(backend.status()), backend.pools())
    read = {
        p["base_model_id"]: (p["defaults"]["guidance_kind"], p["defaults"]["negative_prompt"]) for p in status["pools"]
    }
    assert read == {SDXL: ("cfg", True), FLUX_MODEL_ID: ("distilled", False)}
    # And each pool's denoiser storage (QUANTIZE: no plan on the CPU, so `auto` keeps both native).
    assert [p["storage"] for p in status["pools"]] == ["native", "native"]
