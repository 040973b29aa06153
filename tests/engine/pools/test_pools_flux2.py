"""A FLUX.2 [klein] pool beside an SDXL and a FLUX.1 one: a klein LoRA routed by its card, its metadata or its
names, a FLUX.1 LoRA to the FLUX.1 pool though both share BFL's block names; concurrent clients mixing klein and
SDXL LoRAs each getting exactly their own image; every base bit-exact after a mixed run with failures; POST
/models/<klein> and a klein LoRA on POST / reaching it, a FLUX.1 LoRA sent to it by name a 400 naming the family."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.requests import GenerateRequest, LoraSpec
from families.flux import MODEL_ID as FLUX1
from families.flux2 import MODEL_ID
from serving.demo.synthetic import kohya_metadata, save_lora
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of, generate
from tests.support.dit import assert_components_pristine, hub_pools, pool_of, response_image
from tests.support.dit import pool_request as request
from tests.support.flux import write_flux_loras
from tests.support.flux2 import ATTENTION, CASES, factors, lora_file, write_flux2_loras
from tests.support.loras import SDXL, card, kohya_file, peft_file, sft
from tests.support.mixed import assert_mixed_clients_get_their_own_images
from tests.support.mixed import mixed_request as mixed


@pytest.fixture(scope="module")
def lora_dir(loaded, loaded_flux, loaded_flux2, hub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("flux2-pool-loras")
    write_flux2_loras(loaded_flux2.pipe, folder)
    write_flux_loras(loaded_flux.pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=72))
    made = factors(loaded_flux2.pipe.transformer, seed=73)
    # By metadata (musubi-tuner's FLUX.2 version), which the judgement reads before any name.
    meta = kohya_metadata(dim=4, alpha=4.0, base_version="flux_2")
    save_lora(folder / "flux2_meta.safetensors", lora_file(made, "peft_bfl"), meta)
    hub.add_repo("flux2-pools/card", {"README.md": card(MODEL_ID), "lora.safetensors": sft(lora_file(made, "aitk"))})
    # Carded klein but made for a klein of another width: its factors fit nothing.
    wide = lora_file({ATTENTION[0]: (torch.ones(2, 64), torch.ones(3 * 64, 2))}, "aitk")
    hub.add_repo("flux2-pools/wide", {"README.md": card(MODEL_ID), "lora.safetensors": sft(wide)})
    hub.add_repo(
        "flux2-pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(loaded.pipe, seed=75)}
    )
    return folder


@pytest.fixture
def pools(loaded, loaded_flux, loaded_flux2, base_settings, clean_hub, lora_dir):
    pipelines = [(loaded, base_settings.base_model_id), (loaded_flux, FLUX1), (loaded_flux2, MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as made:
        yield made


def test_a_klein_lora_goes_to_the_klein_pool_by_its_card_its_metadata_or_its_names(pools):
    assert pool_of(pools, "flux2-pools/card") == MODEL_ID
    assert pool_of(pools, "local:flux2_meta.safetensors") == MODEL_ID
    for case in CASES:
        assert pool_of(pools, f"local:{case.file_name}") == MODEL_ID, case.name
    for name in ("peft", "kohya", "kohya_linear1", "comfy_linear1", "xlabs"):
        assert pool_of(pools, f"local:flux_{name}.safetensors") == FLUX1, name
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL
    result = generate(pools, request(LoraSpec("local:flux2_kohya.safetensors")))
    assert result.image.size == (64, 64) and result.adapters[0].ref == "local:flux2_kohya.safetensors"


def test_a_flux1_lora_sent_to_the_klein_pool_by_name_is_a_400_naming_both_bases(pools):
    """Its shapes say FLUX.1, so it is for the FLUX.1 pool, never run as a no-op on klein's (a Space serving klein
    alone refuses it naming the family: tests/engine/families/test_flux2.py)."""
    named = rf"'local:flux_kohya_linear1.safetensors' is for {FLUX1}; the request names {MODEL_ID}"
    with pytest.raises(InvalidRequestError, match=named) as caught:
        generate(pools, request(LoraSpec("local:flux_kohya_linear1.safetensors")), base=MODEL_ID)
    assert caught.value.status == 400
    with pytest.raises(InvalidRequestError, match=r"share one base model"):
        generate(pools, request(LoraSpec("flux2-pools/card"), LoraSpec("local:flux_peft.safetensors")))


MIXED = (
    (),
    ("local:flux2_kohya.safetensors",),
    ("flux2-pools/sdxl-card",),
    ("local:flux2_comfy.safetensors",),
    ("local:sdxl_kohya.safetensors",),
    ("flux2-pools/card",),
    ("local:flux2_peft.safetensors", "local:flux2_expanded.safetensors"),
    ("local:flux2_meta.safetensors",),
)


def mixed_request(index: int) -> tuple[GenerateRequest, str]:
    return mixed(MIXED, MODEL_ID, index)


@pytest.mark.timeout(900)
def test_eight_clients_mixing_klein_and_sdxl_loras_get_exactly_their_own_images(pools):
    assert_mixed_clients_get_their_own_images(pools, [mixed_request(i) for i in range(16)])


@pytest.mark.timeout(900)
def test_every_base_is_bit_exact_after_a_mixed_run_with_failures(pools, loaded, loaded_flux2, pristine, pristine_flux2):
    bases = (SDXL, FLUX1, MODEL_ID)
    before = [generate(pools, request(), base=b).image.tobytes() for b in bases]
    rng = np.random.default_rng(7)
    for step in range(16):
        mixed, base = mixed_request(int(rng.integers(0, 1000)))
        generate(pools, dataclasses.replace(mixed, steps=1), base=base)
        if step % 5 == 2:
            with pytest.raises(IncompatibleLoraError, match=r"do not fit"):
                generate(pools, request(LoraSpec("flux2-pools/wide")))
        if step % 5 == 4:
            with pytest.raises(InvalidRequestError, match=r"share one base model"):
                generate(pools, request(LoraSpec("local:flux_peft.safetensors")), base=MODEL_ID)
    for pool in pools.pools:
        pool.engine.restore_base_weights()
    assert_components_pristine(loaded_flux2.pipe, pristine_flux2, ("transformer", "text_encoder", "vae"))
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))
    assert [generate(pools, request(), base=b).image.tobytes() for b in bases] == before


def test_every_transport_reaches_the_klein_pool(pools):
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    png = {"accept": "image/png"}
    with serve_routes(backend_of(pools)) as url:
        named = httpx.post(f"{url}models/{MODEL_ID}", content=body, headers=png, timeout=120)
        assert named.status_code == 200, named.text[:300]
        assert response_image(named) == generate(pools, request(), base=MODEL_ID).image.tobytes()
        by_lora = httpx.post(url, content=body, headers={"lora": "flux2-pools/card", **png}, timeout=120)
        assert by_lora.status_code == 200, by_lora.text[:300]
        assert response_image(by_lora) == generate(pools, request(LoraSpec("flux2-pools/card"))).image.tobytes()
        wide = httpx.post(url, content=body, headers={"lora": "flux2-pools/wide"}, timeout=120)
        assert wide.status_code == 400 and wide.json()["error_type"] == "IncompatibleLoraError"
        assert "(56, 56)" in wide.json()["error"]
