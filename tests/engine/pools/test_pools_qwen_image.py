"""A Qwen-Image pool beside an SDXL one: a Qwen-Image LoRA routed by its card, its metadata or its names; one
sent to the SDXL pool a 400 naming both bases; a Qwen-Image-carded LoRA whose shapes fit nothing a 400 naming the
layer; concurrent clients mixing both pools' LoRAs each get exactly their own single-client image; both bases
bit-exact after a mixed run with failures."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from engine.requests import LoraSpec
from families import Family
from families.qwen_image import MODEL_ID
from tests.support.checks import generate
from tests.support.dit import pool_of
from tests.support.dit import pool_request as request
from tests.support.loras import SDXL
from tests.support.qwen_image import CASES


@pytest.fixture
def pools(family_pools):
    """The family's pools with the pools it is served beside (tests/support/pools.py)."""
    return family_pools(Family.QWEN_IMAGE)


def test_a_qwen_image_lora_goes_to_its_pool_by_its_card_its_metadata_or_its_names(pools):
    assert pool_of(pools, "qwen-pools/card") == MODEL_ID
    assert pool_of(pools, "local:qwen_meta.safetensors") == MODEL_ID
    for case in CASES:
        assert pool_of(pools, f"local:{case.file_name}") == MODEL_ID, case.name
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL


def test_a_qwen_image_lora_sent_to_the_sdxl_pool_is_a_400_naming_both_bases(pools):
    for ref in ("qwen-pools/card", "local:qwen_kohya.safetensors"):
        with pytest.raises(InvalidRequestError, match=rf"is for {MODEL_ID}.*the request names {SDXL}") as caught:
            generate(pools, request(LoraSpec(ref)), base=SDXL)
        assert caught.value.status == 400
