"""Each DiT family's pool beside SDXL's (and those it shares names with), one test each over the families
(tests/support/pools.py): eight clients mixing the pools' LoRAs each get exactly the image their request gets
alone, after a mixed run with refusals every base is bit-exact, and every transport (POST /models/<base>, POST / with
the family's LoRA) reaches the family's pool."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest

from engine.requests import GenerateRequest, LoraSpec
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of, generate
from tests.support.dit import assert_components_pristine, response_image
from tests.support.dit import pool_request as request
from tests.support.mixed import assert_mixed_clients_get_their_own_images, mixed_request
from tests.support.pools import POOLS, PoolFamily

IDS = [row.family.value for row in POOLS]


@pytest.fixture
def pools(request: pytest.FixtureRequest, family_pools):
    """(row, pools) for the test's family: the pools it is served with, over the session's tiny pipelines."""
    row: PoolFamily = request.param
    return row, family_pools(row.family)


def mixed(row: PoolFamily, index: int) -> tuple[GenerateRequest, str]:
    return mixed_request(row.mixed, row.model_id, index)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pools", POOLS, ids=IDS, indirect=True)
def test_eight_clients_mixing_the_pools_loras_get_exactly_their_own_images(pools):
    row, made = pools
    assert_mixed_clients_get_their_own_images(made, [mixed(row, i) for i in range(row.clients)])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pools", POOLS, ids=IDS, indirect=True)
def test_every_base_is_bit_exact_after_a_mixed_run_with_failures(pools, tiny_models):
    row, made = pools
    bases = [model_id for _, model_id in row.pipelines(tiny_models)]
    before = [generate(made, request(), base=b).image.tobytes() for b in bases]
    rng = np.random.default_rng(row.rng_seed) if row.rng_seed is not None else None
    for step in range(row.steps):
        work, base = mixed(row, int(rng.integers(0, 1000)) if rng is not None else step)
        if row.run_steps is not None:
            work = dataclasses.replace(work, steps=row.run_steps)
        generate(made, work, base=base)
        for refusal in row.refusals:
            if step % refusal.every == refusal.at:
                with pytest.raises(refusal.error, match=refusal.match) as caught:
                    generate(made, request(*(LoraSpec(r) for r in refusal.loras)), base=refusal.base)
                assert caught.value.status == 400 and all(f in str(caught.value) for f in refusal.fragments)
    for pool in made.pools:
        pool.engine.restore_base_weights()
    for family in row.served:
        pristine = tiny_models.pristine(family)
        components = sorted({key.split(".")[0] for key in pristine})
        assert_components_pristine(tiny_models.loaded(family).pipe, pristine, components)
    assert [generate(made, request(), base=b).image.tobytes() for b in bases] == before


@pytest.mark.parametrize("pools", POOLS, ids=IDS, indirect=True)
def test_every_transport_reaches_the_familys_pool(pools):
    row, made = pools
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    png = {"accept": "image/png"}
    with serve_routes(backend_of(made)) as url:
        named = httpx.post(f"{url}models/{row.model_id}", content=body, headers=png, timeout=120)
        assert named.status_code == 200, named.text[:300]
        assert response_image(named) == generate(made, request(), base=row.model_id).image.tobytes()
        by_lora = httpx.post(url, content=body, headers={"lora": row.card, **png}, timeout=120)
        assert by_lora.status_code == 200, by_lora.text[:300]
        assert response_image(by_lora) == generate(made, request(LoraSpec(row.card))).image.tobytes()
        wide = httpx.post(url, content=body, headers={"lora": row.wide}, timeout=120)
        assert wide.status_code == 400 and wide.json()["error_type"] == "IncompatibleLoraError"
        assert all(fragment in wide.json()["error"] for fragment in row.wide_fragments), wide.json()["error"]
