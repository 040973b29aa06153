"""A Qwen-Image pool beside an SDXL one: a Qwen-Image LoRA routed by its card, its metadata or its names; one
sent to the SDXL pool a 400 naming both bases; a Qwen-Image-carded LoRA whose shapes fit nothing a 400 naming the
layer; concurrent clients mixing both pools' LoRAs each get exactly their own single-client image; both bases
bit-exact after a mixed run with failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.requests import GenerateRequest, LoraSpec
from families.qwen_image import MODEL_ID
from serving.demo.synthetic import kohya_metadata, save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, hub_pools, pool_of
from tests.support.dit import pool_request as request
from tests.support.loras import SDXL, card, kohya_file, sft
from tests.support.mixed import assert_mixed_clients_get_their_own_images
from tests.support.mixed import mixed_request as mixed
from tests.support.qwen_image import CASES, MODULES, factors, lora_file, write_qwen_loras


@pytest.fixture(scope="module")
def lora_dir(loaded, loaded_qwen_image, hub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen-pool-loras")
    write_qwen_loras(loaded_qwen_image.pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=62))
    # Metadata decides it: musubi-tuner's Qwen-Image version over attention-only diffusers names, which FLUX.1's
    # double blocks share (its names alone leave FLUX.1 and Qwen-Image).
    made = factors(loaded_qwen_image.pipe.transformer, seed=63)
    attention = {m: f for m, f in made.items() if ".attn.to_" in m}
    metadata = kohya_metadata(dim=4, alpha=4.0, base_version="qwen_image")
    save_lora(folder / "qwen_meta.safetensors", lora_file(attention, "peft", None), metadata)
    hub.add_repo(
        "qwen-pools/card", {"README.md": card(MODEL_ID), "lora.safetensors": sft(lora_file(made, "peft", None))}
    )
    wide = lora_file({m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}, "peft", None)
    hub.add_repo("qwen-pools/wide", {"README.md": card(MODEL_ID), "lora.safetensors": sft(wide)})
    return folder


@pytest.fixture
def pools(loaded, loaded_qwen_image, base_settings, clean_hub, lora_dir):
    pipelines = [(loaded, base_settings.base_model_id), (loaded_qwen_image, MODEL_ID)]
    with hub_pools(pipelines, base_settings, clean_hub.url, lora_dir) as made:
        yield made


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


MIXED: tuple[tuple[str, ...], ...] = (
    (),
    ("local:qwen_kohya.safetensors",),
    ("local:sdxl_kohya.safetensors",),
    ("qwen-pools/card",),
    ("local:qwen_comfy.safetensors", "local:qwen_bare.safetensors"),
    ("local:qwen_meta.safetensors",),
)


def mixed_request(index: int) -> tuple[GenerateRequest, str]:
    return mixed(MIXED, MODEL_ID, index)


@pytest.mark.timeout(900)
def test_eight_clients_mixing_qwen_image_and_sdxl_loras_get_exactly_their_own_images(pools):
    assert_mixed_clients_get_their_own_images(pools, [mixed_request(i) for i in range(18)])


@pytest.mark.timeout(900)
def test_both_bases_are_bit_exact_after_a_mixed_run_with_failures(
    pools, loaded, loaded_qwen_image, pristine, pristine_qwen_image
):
    bases = (SDXL, MODEL_ID)
    before = [generate(pools, request(), base=b).image.tobytes() for b in bases]
    for step in range(12):
        mixed, base = mixed_request(step)
        generate(pools, mixed, base=base)
        if step % 4 == 1:
            with pytest.raises(IncompatibleLoraError, match=r"do not fit transformer\.transformer_blocks\.0") as caught:
                generate(pools, request(LoraSpec("qwen-pools/wide")))
            assert caught.value.status == 400 and "(72, 72)" in str(caught.value)
    for pool in pools.pools:
        pool.engine.restore_base_weights()
    assert_components_pristine(loaded_qwen_image.pipe, pristine_qwen_image, ("transformer", "text_encoder", "vae"))
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))
    assert [generate(pools, request(), base=b).image.tobytes() for b in bases] == before
