"""FLUX.1 Kontext [dev] as a pool: instruction editing on the tiny Kontext against diffusers' own
FluxKontextPipeline with the LoRA fused; no request without an image; its LoRAs routed to it by what they
declare (card base, metadata, Civitai's label); FLUX.1 LoRAs that declare nothing stay on FLUX.1's pool beside
it (test_flux.py's routing, over every served family's tiny pool)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import FluxKontextInpaintPipeline, FluxKontextPipeline
from safetensors import safe_open
from safetensors.torch import save_file

from engine.errors import InvalidRequestError
from engine.families.flux_kontext import FAMILY
from engine.families.origin import judge_origin
from engine.pools.routing import pick_pool
from engine.requests import GenerateRequest, LoraSpec
from families.flux_kontext import MODEL_ID
from lora_catalog.entries import Family
from tests.support.checks import generate
from tests.support.dit import served_pools
from tests.support.flux import CASES, write_flux_loras
from tests.support.image_inputs import PROMPT, input_image, input_mask, mode_reference
from tests.support.images import assert_images_close, level_difference

LORA = CASES[0].file_name


@pytest.fixture(scope="module")
def kontext_loras(loaded_flux_kontext, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FLUX LoRA whose metadata declares Kontext (as ai-toolkit's ModelSpec does), in the folder."""
    folder = tmp_path_factory.mktemp("kontext-loras")
    write_flux_loras(loaded_flux_kontext.pipe, folder, cases=CASES[:1])
    path = folder / LORA
    with safe_open(str(path), "pt") as opened:
        tensors = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
        metadata = opened.metadata() or {}
    save_file(tensors, str(path), {**metadata, "modelspec.architecture": "flux-1-kontext-dev/lora"})
    return folder


@pytest.fixture
def kontext(family_engine, kontext_loras):
    return family_engine(Family.FLUX_KONTEXT, kontext_loras)


def edit(**fields: object) -> GenerateRequest:
    request = {"prompt": PROMPT, "steps": 3, "guidance": 2.5, "seed": 7, "image": input_image(), **fields}
    return GenerateRequest(**request)  # type: ignore[arg-type]


def test_the_tiny_kontext_is_an_editing_pool(loaded_flux_kontext):
    assert type(loaded_flux_kontext.pipe) is FluxKontextPipeline and loaded_flux_kontext.family is FAMILY
    defaults = loaded_flux_kontext.defaults
    assert defaults.needs_image and defaults.modes == ("image-to-image", "inpainting")
    assert defaults.strength is None and defaults.inpaint_strength == 1.0


def test_an_edit_equals_diffusers_kontext_with_the_lora_fused(kontext, kontext_loras, tiny_flux_kontext_dir):
    ours = generate(kontext, edit(loras=(LoraSpec(f"local:{LORA}"),)))
    assert ours.image.size == (64, 64) and ours.request.mode == "image-to-image"
    call = {"image": input_image().to_pil(), "num_inference_steps": 3, "guidance_scale": 2.5}
    call |= {"width": 64, "height": 64, "_auto_resize": False, "max_area": 64 * 64}
    reference = mode_reference(
        FluxKontextPipeline,
        FluxKontextPipeline,
        tiny_flux_kontext_dir,
        kontext_loras,
        LORA,
        components=("transformer", "text_encoder"),
        **call,
    )
    assert_images_close(ours.image, reference)
    assert level_difference(generate(kontext, edit()).image, ours.image) > 2


def test_kontext_inpainting_equals_diffusers_own(kontext, kontext_loras, tiny_flux_kontext_dir):
    ours = generate(kontext, edit(loras=(LoraSpec(f"local:{LORA}"),), mask_image=input_mask(), strength=0.8))
    call = {"image": input_image().to_pil(), "mask_image": input_mask().to_pil(), "strength": 0.8}
    call |= {
        "num_inference_steps": 3,
        "guidance_scale": 2.5,
        "width": 64,
        "height": 64,
        "_auto_resize": False,
        "max_area": 64 * 64,
    }
    reference = mode_reference(
        FluxKontextPipeline,
        FluxKontextInpaintPipeline,
        tiny_flux_kontext_dir,
        kontext_loras,
        LORA,
        components=("transformer", "text_encoder"),
        **call,
    )
    assert_images_close(ours.image, reference)


def test_a_request_without_an_image_is_refused_saying_it_needs_one(kontext):
    text = GenerateRequest(prompt="a fox", steps=2, width=64, height=64)
    with pytest.raises(InvalidRequestError, match="edits an image: a text-to-image request needs one; accepted"):
        generate(kontext, text)
    # Kontext takes no strength: accepted, and said to be unused.
    assert "strength does not apply" in kontext.defaults.ignored(kontext.check(edit(strength=0.5)))[0]


@pytest.mark.parametrize(
    ("bases", "metadata", "label"),
    [
        ([MODEL_ID], {}, None),
        ([], {"modelspec.architecture": "flux-1-kontext-dev/lora"}, None),
        ([], {"ss_sd_model_name": "flux1-kontext-dev.safetensors"}, None),
        ([], {}, Family.FLUX_KONTEXT),
    ],
)
def test_kontext_loras_route_to_the_kontext_pool(tiny_pipes, bases, metadata, label):
    pools = served_pools(tiny_pipes)
    origin = judge_origin(bases, lambda: (metadata, {}), declared_family=label)
    assert origin.families == (Family.FLUX_KONTEXT,)
    assert pools[pick_pool("LoRA 'x'", origin, pools)].family is Family.FLUX_KONTEXT


def test_civitais_kontext_label_names_the_family():
    from lora_catalog.civitai.bases import civitai_base

    found = civitai_base("Flux.1 Kontext")
    assert found is not None and (found.family, found.base_model_id) == (Family.FLUX_KONTEXT, MODEL_ID)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
