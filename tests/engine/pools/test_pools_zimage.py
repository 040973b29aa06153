"""A Z-Image pool beside an SDXL and a FLUX one: a Z-Image LoRA routed by its card, its metadata or its names;
POST /models/Tongyi-MAI/Z-Image-Turbo and a Z-Image LoRA on POST / reaching it; a Z-Image-carded LoRA whose
shapes fit nothing a 400 naming the layer; every base bit-exact after a mixed run."""

from __future__ import annotations

import pytest

from engine.requests import LoraSpec
from families import Family
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
from tests.support.checks import generate
from tests.support.dit import pool_of
from tests.support.dit import pool_request as request
from tests.support.loras import SDXL
from tests.support.zimage import CASES


@pytest.fixture
def pools(family_pools):
    """The family's pools with the pools it is served beside (tests/support/pools.py)."""
    return family_pools(Family.ZIMAGE)


def test_a_zimage_lora_goes_to_the_zimage_pool_by_its_card_its_metadata_or_its_names(pools):
    assert pool_of(pools, "zimage-pools/card") == ZIMAGE_MODEL_ID
    assert pool_of(pools, "local:zimage_meta.safetensors") == ZIMAGE_MODEL_ID
    for case in CASES:
        assert pool_of(pools, f"local:{case.file_name}") == ZIMAGE_MODEL_ID, case.name
    assert pool_of(pools, "local:flux_peft.safetensors") == FLUX_MODEL_ID
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL
    result = generate(pools, request(LoraSpec("local:zimage_dotted.safetensors")))
    assert result.image.size == (64, 64) and result.adapters[0].ref == "local:zimage_dotted.safetensors"
