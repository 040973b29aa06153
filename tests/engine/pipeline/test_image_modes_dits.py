"""Image-to-image and inpainting on the newer DiT pools (FLUX.2 [klein], Qwen-Image), against diffusers' own
pipelines built from the same components with the LoRA fused (`from_pipe`, as test_image_modes.py for the
others): klein inpaints (its image-to-image is a reference edit on its own pipeline), Qwen-Image does both."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from diffusers import (
    Flux2KleinInpaintPipeline,
    Flux2KleinPipeline,
    QwenImageImg2ImgPipeline,
    QwenImageInpaintPipeline,
    QwenImagePipeline,
)

from engine.pipeline.modes import mode_pipeline
from engine.pools.engine import Engine
from engine.requests import GenerateRequest, LoraSpec
from families.flux2 import MODEL_ID as KLEIN
from families.qwen_image import MODEL_ID as QWEN
from tests.support.checks import generate
from tests.support.dit import local_engine
from tests.support.flux2 import CASES as KLEIN_CASES
from tests.support.flux2 import write_flux2_loras
from tests.support.image_inputs import PROMPT, input_image, input_mask, mode_reference, resident_bytes, storages
from tests.support.images import assert_images_close, level_difference
from tests.support.qwen_image import CASES as QWEN_CASES
from tests.support.qwen_image import write_qwen_loras

KLEIN_LORA = KLEIN_CASES[0].file_name
QWEN_LORA = QWEN_CASES[0].file_name
# A preview after every step, by the family's latent projection.
PREVIEWS: dict[str, Any] = {"preview_vae": "none", "preview_every": 1}


@pytest.fixture(scope="module")
def dit_loras(loaded_flux2, loaded_qwen_image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dit-mode-loras")
    write_flux2_loras(loaded_flux2.pipe, folder, cases=KLEIN_CASES[:1])
    write_qwen_loras(loaded_qwen_image.pipe, folder, cases=QWEN_CASES[:1])
    return folder


@pytest.fixture(scope="module")
def klein(loaded_flux2, base_settings, dit_loras):
    settings = base_settings.replace(local_lora_dir=dit_loras, base_model_id=KLEIN, **PREVIEWS)
    with local_engine(loaded_flux2, settings, dit_loras) as made:
        yield made


@pytest.fixture(scope="module")
def qwen(loaded_qwen_image, base_settings, dit_loras):
    settings = base_settings.replace(local_lora_dir=dit_loras, base_model_id=QWEN, **PREVIEWS)
    with local_engine(loaded_qwen_image, settings, dit_loras) as made:
        yield made


def image_request(lora: str | None, guidance: float, *, mask: bool, strength: float = 0.6) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT,
        loras=(LoraSpec(f"local:{lora}"),) if lora else (),
        steps=4,
        guidance=guidance,
        seed=7,
        image=input_image(),
        mask_image=input_mask() if mask else None,
        strength=strength,
    )


def test_klein_inpainting_equals_diffusers_own(klein, dit_loras, tiny_flux2_dir):
    ours = generate(klein, image_request(KLEIN_LORA, 1.0, mask=True, strength=0.8))
    assert ours.request.mode == "inpainting" and ours.image.size == (64, 64)
    call: dict[str, Any] = {"image": input_image().to_pil(), "mask_image": input_mask().to_pil(), "strength": 0.8}
    call |= {"num_inference_steps": 4, "guidance_scale": 1.0, "width": 64, "height": 64}
    reference = mode_reference(
        Flux2KleinPipeline,
        Flux2KleinInpaintPipeline,
        tiny_flux2_dir,
        dit_loras,
        KLEIN_LORA,
        components=("transformer",),
        **call,
    )
    assert_images_close(ours.image, reference, "klein inpainting")
    plain = generate(klein, image_request(None, 1.0, mask=True, strength=0.8))
    assert level_difference(plain.image, ours.image) > 2


def test_klein_edits_from_references_on_its_own_pipeline_and_says_so(klein):
    """klein's image-to-image is a reference edit on its own Flux2KleinPipeline (no strength: it takes none);
    test_references_flux2.py compares it with diffusers'."""
    defaults = klein.defaults
    assert defaults.modes == ("text-to-image", "image-to-image", "inpainting") and not defaults.needs_image
    assert (defaults.strength, defaults.inpaint_strength) == (None, 0.8)
    assert (defaults.max_reference_images, defaults.inpaint_references) == (4, True)
    checked = klein.check(image_request(None, 1.0, mask=False))
    assert mode_pipeline(klein.loaded.pipe, checked, klein.loaded.family) is klein.loaded.pipe


@pytest.mark.parametrize(
    ("mode", "cls"), [("image-to-image", QwenImageImg2ImgPipeline), ("inpainting", QwenImageInpaintPipeline)]
)
def test_qwen_image_modes_equal_diffusers_own(qwen, dit_loras, tiny_qwen_image_dir, mode, cls):
    """At true CFG 4 (the card's " " as the negative prompt), as the pool runs by default."""
    inpainting = mode == "inpainting"
    ours = generate(qwen, image_request(QWEN_LORA, 4.0, mask=inpainting))
    assert ours.request.mode == mode and ours.image.size == (64, 64)
    call: dict[str, Any] = {"image": input_image().to_pil(), "strength": 0.6, "num_inference_steps": 4}
    call |= {"true_cfg_scale": 4.0, "negative_prompt": " ", "width": 64, "height": 64}
    if inpainting:
        call["mask_image"] = input_mask().to_pil()
    reference = mode_reference(
        QwenImagePipeline, cls, tiny_qwen_image_dir, dit_loras, QWEN_LORA, components=("transformer",), **call
    )
    assert_images_close(ours.image, reference, mode)
    plain = generate(qwen, replace(image_request(QWEN_LORA, 4.0, mask=inpainting), loras=()))
    assert level_difference(plain.image, ours.image) > 2


def test_qwen_image_pool_defaults_name_diffusers_strengths(qwen):
    defaults = qwen.defaults
    assert defaults.modes == ("text-to-image", "image-to-image", "inpainting") and not defaults.needs_image
    assert (defaults.strength, defaults.inpaint_strength) == (0.6, 0.6)


@pytest.fixture(params=["klein", "qwen"])
def dit_pool(request) -> tuple[Engine, bool]:
    """Each pool with the mask its image mode needs (klein only inpaints)."""
    return request.getfixturevalue(request.param), request.param == "klein"


def test_an_image_run_leaves_the_pool_as_it_was(dit_pool):
    engine, mask = dit_pool
    pipe = engine.loaded.pipe
    text = GenerateRequest(prompt=PROMPT, steps=2, width=64, height=64, seed=3)
    before = generate(engine, text).image.tobytes()
    resident, scheduler = resident_bytes(pipe), dict(pipe.scheduler.config)
    generate(engine, image_request(QWEN_LORA if not mask else KLEIN_LORA, 1.0, mask=mask))
    built = mode_pipeline(pipe, engine.check(image_request(None, 1.0, mask=mask)), engine.loaded.family)
    assert type(built) is not type(pipe) and storages(built) == storages(pipe)
    assert resident_bytes(pipe) == resident and dict(pipe.scheduler.config) == scheduler
    assert generate(engine, text).image.tobytes() == before


def test_strength_runs_its_share_of_the_steps_with_previews(dit_pool):
    """Strength 0.6 of 10 steps runs 6, as diffusers counts them; previews after steps 1 to 5 (the last one's would
    race the final image), from the packed latents each mode's callback hands over."""
    engine, mask = dit_pool
    steps: list[tuple[int, int]] = []
    frames: list[int] = []
    request = replace(image_request(None, 1.0, mask=mask), steps=10)
    with engine.prepare(request) as prepared:
        engine.run(
            prepared,
            progress=lambda done, total: steps.append((done, total)),
            preview=lambda step, image: frames.append(step),
        )
    assert steps == [(k, 6) for k in range(1, 7)] and frames == [1, 2, 3, 4, 5]
