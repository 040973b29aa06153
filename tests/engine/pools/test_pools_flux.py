"""A FLUX pool beside an SDXL one: routing by a FLUX LoRA's card, metadata or names; concurrent clients mixing
FLUX and SDXL LoRAs each getting exactly their own image; both bases bit-exact after a mixed run with failures;
and every transport (POST /models/<FLUX>, POST / with a FLUX LoRA, a comparison) reaching the FLUX pool."""

from __future__ import annotations

import httpx
import pytest

from engine.compare import CompareRequest
from engine.errors import InvalidRequestError
from engine.requests import LoraSpec
from families import Family
from families.flux import MODEL_ID as FLUX_MODEL_ID
from serving.backends import blocking
from serving.ui.pool_views import pools_status_json
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of, generate
from tests.support.dit import pool_of
from tests.support.dit import pool_request as request
from tests.support.loras import SDXL


@pytest.fixture
def pools(family_pools):
    """The family's pools with the pools it is served beside (tests/support/pools.py)."""
    return family_pools(Family.FLUX)


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


def test_every_transport_reaches_the_flux_pool(pools):
    """Beyond what every family's pool answers (test_pools_mixed.py): an unserved base, the width rule, a
    comparison and the status JSON."""
    backend = backend_of(pools)
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    with serve_routes(backend) as url:
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
