"""Wan 2.2 TI2V-5B's image-to-video on a tiny 5B-shaped Wan (48 latent channels, Wan 2.2's VAE layout,
`expand_timesteps`): a `wan` pool of it takes an image besides text, and its video equals diffusers' own
WanImageToVideoPipeline (no image encoder) with the LoRA loaded and fused, within 2 levels per channel on every
frame; text-to-video stays WanPipeline's; the base bit-exact after. A Wan 2.1 text-to-video pool refuses an image
with a 400 naming the pool. The family's files: families/wan.py, engine/families/wan.py (its tiny 5B-shaped
builder: engine/families/tiny_wan.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanImageToVideoPipeline

from engine.errors import InvalidRequestError
from engine.families.tiny_wan import build_tiny_ti2v_pipeline
from engine.families.wan import FAMILY
from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, LoraSpec
from families.wan import MODEL_ID, MODEL_ID_5B
from lora_catalog.entries import Family
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine, pixels
from tests.support.image_inputs import example_image, input_image
from tests.support.images import assert_images_close
from tests.support.wan import CASES, FRAMES, PROMPT, diffusers_frames, write_wan_loras


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ti2v_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-wan-ti2v") / "pipeline"
    build_tiny_ti2v_pipeline(0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded_ti2v(ti2v_dir, base_settings):
    return load_pipeline(base_settings.replace(model_id=str(ti2v_dir), base_model_id=MODEL_ID_5B))


@pytest.fixture(scope="module")
def pristine_ti2v(loaded_ti2v) -> dict[str, torch.Tensor]:
    modules = {n: m for n, m in loaded_ti2v.pipe.components.items() if isinstance(m, torch.nn.Module)}
    return {f"{n}.{k}": v.detach().clone() for n, m in modules.items() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def ti2v_loras(loaded_ti2v, pristine_ti2v, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-ti2v-loras")
    write_wan_loras(loaded_ti2v.pipe, folder, CASES[:2])
    return folder


@pytest.fixture
def engine(loaded_ti2v, base_settings, ti2v_loras):
    settings = base_settings.replace(local_lora_dir=ti2v_loras, base_model_id=MODEL_ID_5B)
    with local_engine(loaded_ti2v, settings, ti2v_loras) as opened:
        yield opened


def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, image: bool = True):
    if not image:
        return diffusers_frames(tiny_dir, folder, weight_name, scale)
    return diffusers_frames(
        tiny_dir, folder, weight_name, scale, pipeline_class=WanImageToVideoPipeline, image=example_image()
    )


def frames_close(ours, theirs, what: str) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_images_close(pixels(a), pixels(b), f"{what}: frame {index}")


def test_a_ti2v_pool_takes_text_or_an_image(loaded_ti2v, engine, ti2v_loras, ti2v_dir):
    assert loaded_ti2v.family is FAMILY and loaded_ti2v.pipe.config.expand_timesteps
    assert loaded_ti2v.defaults.modes == ("text-to-image", "image-to-image") and not loaded_ti2v.defaults.needs_image
    text = generate(engine, request())
    frames_close(text.frames, reference(ti2v_dir, ti2v_loras, None, image=False), "text-to-video")
    result = generate(engine, request(image=input_image()))
    assert result.is_video and len(result.frames) == FRAMES and result.request.mode == "image-to-image"
    frames_close(result.frames, reference(ti2v_dir, ti2v_loras, None), "image-to-video")
    assert np.abs(pixels(result.frames[-1]) - pixels(text.frames[-1])).mean() > 1, "the image must matter"


@pytest.mark.parametrize("case", CASES[:2], ids=[c.name for c in CASES[:2]])
def test_image_to_video_with_a_lora_matches_diffusers_on_every_frame(case, engine, ti2v_loras, ti2v_dir):
    base = reference(ti2v_dir, ti2v_loras, None)
    result = generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8), image=input_image()))
    theirs = reference(ti2v_dir, ti2v_loras, case.file_name, 0.8)
    assert np.abs(pixels(theirs[-1]) - pixels(base[-1])).mean() > 1, "the LoRA must visibly change the video"
    frames_close(result.frames, theirs, case.name)


def test_the_base_is_bit_exact_after_image_and_text_runs(engine, loaded_ti2v, pristine_ti2v):
    for index, case in enumerate((*CASES[:2], CASES[0])):
        image = input_image() if index % 2 == 0 else None
        generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.6 + index / 10), steps=1, image=image))
    engine.restore_base_weights()
    assert_components_pristine(loaded_ti2v.pipe, pristine_ti2v, ("transformer", "text_encoder", "vae"))


def test_a_wan_2_1_text_to_video_pool_refuses_an_image_naming_the_pool(family_engine, loaded_wan, tmp_path):
    assert loaded_wan.defaults.modes == ("text-to-image",)
    t2v = family_engine(Family.WAN, tmp_path)
    with pytest.raises(InvalidRequestError, match=rf"this pool's model \({MODEL_ID}\) is text-to-video only") as e:
        generate(t2v, request(image=input_image()))
    assert e.value.status == 400
