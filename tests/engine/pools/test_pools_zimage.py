"""A Z-Image pool beside an SDXL and a FLUX one: a Z-Image LoRA routed by its card, its metadata or its names;
POST /models/Tongyi-MAI/Z-Image-Turbo and a Z-Image LoRA on POST / reaching it; a Z-Image-carded LoRA whose
shapes fit nothing a 400 naming the layer; every base bit-exact after a mixed run."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from engine.requests import LoraSpec
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
from serving.demo.synthetic import kohya_metadata, save_lora
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of, generate
from tests.support.dit import hub_pools, pool_of, response_image
from tests.support.dit import pool_request as request
from tests.support.flux import CASES as FLUX_CASES
from tests.support.flux import write_flux_loras
from tests.support.loras import SDXL, card, kohya_file, sft
from tests.support.zimage import CASES, MODULES, factors, lora_file, write_zimage_loras


@pytest.fixture(scope="module")
def lora_dir(loaded, loaded_flux, loaded_zimage, hub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("zimage-pool-loras")
    write_zimage_loras(loaded_zimage.pipe, folder)
    write_flux_loras(loaded_flux.pipe, folder, cases=FLUX_CASES[:1])
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=52))
    # Metadata alone routes it: musubi-tuner's Z-Image version over PEFT's own names, which no family claims.
    made = factors(loaded_zimage.pipe.transformer, seed=53)
    odd = {k.replace("transformer.", "base_model.model.", 1): v for k, v in lora_file(made, "peft", None).items()}
    save_lora(folder / "zimage_meta.safetensors", odd, kohya_metadata(dim=4, alpha=4.0, base_version="zimage"))
    hub.add_repo(
        "zimage-pools/card",
        {"README.md": card(ZIMAGE_MODEL_ID), "lora.safetensors": sft(lora_file(made, "peft", None))},
    )
    wide = lora_file({m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}, "peft", None)
    hub.add_repo("zimage-pools/wide", {"README.md": card(ZIMAGE_MODEL_ID), "lora.safetensors": sft(wide)})
    return folder


@pytest.fixture
def pools(loaded, loaded_flux, loaded_zimage, base_settings, clean_hub, lora_dir):
    pipelines = [(loaded, base_settings.base_model_id), (loaded_flux, FLUX_MODEL_ID), (loaded_zimage, ZIMAGE_MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as made:
        yield made


def test_a_zimage_lora_goes_to_the_zimage_pool_by_its_card_its_metadata_or_its_names(pools):
    assert pool_of(pools, "zimage-pools/card") == ZIMAGE_MODEL_ID
    assert pool_of(pools, "local:zimage_meta.safetensors") == ZIMAGE_MODEL_ID
    for case in CASES:
        assert pool_of(pools, f"local:{case.file_name}") == ZIMAGE_MODEL_ID, case.name
    assert pool_of(pools, "local:flux_peft.safetensors") == FLUX_MODEL_ID
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL
    result = generate(pools, request(LoraSpec("local:zimage_dotted.safetensors")))
    assert result.image.size == (64, 64) and result.adapters[0].ref == "local:zimage_dotted.safetensors"


def test_every_base_is_bit_exact_after_a_mixed_run(pools):
    bases = (SDXL, FLUX_MODEL_ID, ZIMAGE_MODEL_ID)
    before = [generate(pools, request(), base=b).image.tobytes() for b in bases]
    for ref in ("zimage-pools/card", "local:flux_peft.safetensors", "local:zimage_kohya.safetensors"):
        generate(pools, request(LoraSpec(ref, scale=0.7)))
        generate(pools, request(LoraSpec("local:sdxl_kohya.safetensors")))
    for pool in pools.pools:
        pool.engine.restore_base_weights()
    assert [generate(pools, request(), base=b).image.tobytes() for b in bases] == before


def test_every_transport_reaches_the_zimage_pool(pools):
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    png = {"accept": "image/png"}
    with serve_routes(backend_of(pools)) as url:
        named = httpx.post(f"{url}models/{ZIMAGE_MODEL_ID}", content=body, headers=png, timeout=120)
        assert named.status_code == 200, named.text[:300]
        assert response_image(named) == generate(pools, request(), base=ZIMAGE_MODEL_ID).image.tobytes()
        by_base = httpx.post(url, content=body, headers={"lora": "zimage-pools/card", **png}, timeout=120)
        assert by_base.status_code == 200, by_base.text[:300]
        assert response_image(by_base) == generate(pools, request(LoraSpec("zimage-pools/card"))).image.tobytes()
        wide = httpx.post(url, content=body, headers={"lora": "zimage-pools/wide"}, timeout=120)
        assert wide.status_code == 400 and wide.json()["error_type"] == "IncompatibleLoraError"
        assert "do not fit transformer.layers.0.attention.to_" in wide.json()["error"]
        assert "(24, 24)" in wide.json()["error"]
