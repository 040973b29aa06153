"""A Krea 2 Turbo pool beside an SDXL and a Qwen-Image one (whose diffusers names Krea 2's attention shares): a
Krea 2 LoRA routed by its card, its metadata or its tensors alone (its own layers' names in every naming; the
shared attention names by their widths); a Raw-carded LoRA runs on the Turbo pool at Turbo's defaults, not its
card's (Raw's), with a note, a Turbo-carded one at its card's; four clients with different Krea 2 LoRAs on the one
pool each get exactly their own image. The mixed runs, the bit-exact bases and the transports: test_pools_mixed.py
(tests/support/pools.py's row)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.requests import GenerateRequest, LoraSpec
from families import Family
from families.krea2 import MODEL_ID, RAW_ID
from families.qwen_image import MODEL_ID as QWEN_IMAGE
from tests.support.checks import generate
from tests.support.dit import POOL_PROMPT, pool_of
from tests.support.dit import pool_request as request
from tests.support.krea2 import CASES
from tests.support.loras import SDXL
from tests.support.mixed import assert_mixed_clients_get_their_own_images


@pytest.fixture
def pools(family_pools):
    """The family's pools with the pools it is served beside (tests/support/pools.py)."""
    return family_pools(Family.KREA2)


def test_a_krea2_lora_goes_to_the_krea2_pool_by_its_card_its_metadata_or_its_tensors(pools):
    assert pool_of(pools, "krea2-pools/card") == MODEL_ID
    assert pool_of(pools, "local:krea2_meta.safetensors") == MODEL_ID
    # Names Qwen-Image's claims share, alone: the widths (104, Qwen-Image's tiny 72) decide.
    assert pool_of(pools, "local:krea2_attn.safetensors") == MODEL_ID
    for case in CASES:
        assert pool_of(pools, f"local:{case.file_name}") == MODEL_ID, case.name
    assert pool_of(pools, "local:qwen_peft.safetensors") == QWEN_IMAGE
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL
    result = generate(pools, request(LoraSpec("local:krea2_kohya.safetensors")))
    assert result.image.size == (64, 64) and result.adapters[0].ref == "local:krea2_kohya.safetensors"


def test_a_raw_trained_lora_runs_on_the_turbo_pool_at_turbos_defaults_with_a_note(pools):
    assert pool_of(pools, "krea2-pools/raw-card") == MODEL_ID
    named_nothing = GenerateRequest(prompt=POOL_PROMPT, loras=(LoraSpec("krea2-pools/raw-card"),), width=64, height=64)
    result = generate(pools, named_nothing)
    assert any(f"made for Krea 2 Raw ({RAW_ID}); it runs on Krea 2 Turbo ({MODEL_ID})" in w for w in result.warnings)
    # The Turbo pool's steps (a tiny pool's 4) without CFG, not the 28 steps at 4.5 (Raw's) its card recommends:
    # the request named neither.
    turbo = next(p for p in pools.pools if p.base_model_id == MODEL_ID).engine.defaults
    assert (turbo.guidance, result.request.steps, result.request.guidance) == (0.0, turbo.steps, 0.0)
    assert any("recommends 28 steps and guidance 4.5, Krea 2 Raw's settings; not used" in w for w in result.warnings)
    # What the client names still wins.
    named = generate(pools, dataclasses.replace(named_nothing, steps=2, guidance=1.5))
    assert (named.request.steps, named.request.guidance) == (2, 1.5)


def test_a_turbo_trained_lora_gets_its_cards_settings_on_the_turbo_pool(pools):
    request = GenerateRequest(prompt=POOL_PROMPT, loras=(LoraSpec("krea2-pools/turbo-settings"),), width=64, height=64)
    result = generate(pools, request)
    assert (result.request.steps, result.request.guidance) == (3, 1.5)
    assert not any("not used" in w or "made for" in w for w in result.warnings), result.warnings


@pytest.mark.timeout(900)
def test_four_clients_with_different_krea2_loras_on_one_pool_get_exactly_their_own_images(pools):
    loras = [
        "krea2-pools/card",
        "local:krea2_kohya.safetensors",
        "local:krea2_aitk.safetensors",
        "krea2-pools/raw-card",
    ]
    work = [(request(LoraSpec(ref, scale=0.6 + 0.1 * i), seed=i), MODEL_ID) for i, ref in enumerate(loras * 2)]
    assert_mixed_clients_get_their_own_images(pools, work, clients=4)
