"""Routing a LoRA that fits several families' pools alike (`engine.pools.routing`): a LoRA over BFL's blocks alone,
with FLUX.1's and Chroma's pools served beside SDXL's (equal widths: its tensors cannot tell them apart). What the
LoRA declares (card, metadata) or what only one architecture has still routes it; else the request's named base
picks, and with none the request is a 400 naming the pools it fits and how to pick, not a silent FLUX.1 run
because `MODELS` lists FLUX.1 first."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.requests import LoraSpec
from families import IDENTITIES, Family
from tests.support.checks import generate
from tests.support.dit import pool_request as request

FLUX = IDENTITIES[Family.FLUX].model_id
CHROMA = IDENTITIES[Family.CHROMA].model_id
# FLUX.1's attention and linear2 in kohya's names (tests/support/chroma.py): Chroma's blocks have every layer of it.
BLOCKS_ONLY = "local:flux1_attention.safetensors"


@pytest.fixture
def pools(family_pools):
    """SDXL's, FLUX.1's and Chroma's pools, in that order (tests/support/pools.py's Chroma row)."""
    return family_pools(Family.CHROMA)


def pool_of(pools, *refs: str, base: str = "") -> str:
    return pools.route(request(*(LoraSpec(r) for r in refs)), base).pool.base_model_id


def test_a_lora_fitting_flux1_and_chroma_alike_runs_on_the_base_the_request_names(pools):
    assert [p.base_model_id for p in pools.pools][1:] == [FLUX, CHROMA]
    assert pool_of(pools, BLOCKS_ONLY, base=CHROMA) == CHROMA
    assert pool_of(pools, BLOCKS_ONLY, base=FLUX) == FLUX
    assert pools.route(request(LoraSpec(BLOCKS_ONLY)), CHROMA).reason == "named base"
    # And the named pool runs it: on Chroma with the warning that its tensors fit both.
    result = generate(pools, request(LoraSpec(BLOCKS_ONLY)), base=CHROMA)
    assert any("FLUX.1 and Chroma alike" in w for w in result.warnings)


def test_with_no_base_named_a_lora_fitting_both_is_a_400_naming_both_and_how_to_pick(pools):
    with pytest.raises(InvalidRequestError) as caught:
        pools.route(request(LoraSpec(BLOCKS_ONLY)))
    message = str(caught.value)
    assert caught.value.status == 400
    assert f"{FLUX} (flux)" in message and f"{CHROMA} (chroma)" in message and BLOCKS_ONLY in message
    assert "accepted: a request naming the base" in message and "POST /models/<base>" in message
    # Another LoRA of the request that decides its base decides for both.
    assert pool_of(pools, BLOCKS_ONLY, "local:chroma_peft.safetensors") == CHROMA


def test_what_a_lora_declares_or_only_one_architecture_has_still_routes_it_without_a_named_base(pools):
    assert pool_of(pools, "local:chroma_meta.safetensors") == CHROMA  # ModelSpec "chroma" over the blocks alone
    assert pool_of(pools, "chroma-pools/card") == CHROMA  # its card's base
    assert pool_of(pools, "local:chroma_peft.safetensors") == CHROMA  # distilled_guidance_layer: Chroma's own
    assert pool_of(pools, "local:flux1_with_modulations.safetensors") == FLUX  # FLUX.1's modulations: its own
