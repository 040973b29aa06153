"""Wan 2.1 image-to-video on the tiny image-to-video Wan: every request brings its image; every naming of an
image-to-video LoRA (its image keys, values and embedder included), and a text-to-video LoRA, gives diffusers'
own WanImageToVideoPipeline video with the LoRA fused, within 2 levels per channel on every frame; an I2V LoRA
is told from a T2V one by its image layers; the base bit-exact after. The family's files: families/wan_i2v.py,
engine/families/wan_i2v.py (Wan's names: families/wan_names.py; its tiny builder: engine/families/tiny_wan.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diffusers import WanImageToVideoPipeline
from safetensors import safe_open

from engine.errors import InvalidRequestError
from engine.families.registry import family_spec
from engine.families.wan_i2v import FAMILY
from engine.requests import GenerateRequest, LoraSpec
from families.wan_i2v import MODEL_ID
from lora_catalog.bases import family_from_keys
from lora_catalog.entries import Family
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.image_inputs import example_image, input_image
from tests.support.images import assert_images_close
from tests.support.wan import CASES, FRAMES, I2V_CASES, PROMPT, diffusers_frames, write_wan_loras

T2V_CASE = CASES[0]


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "image": input_image()} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def i2v_loras(loaded_wan_i2v, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-i2v-loras")
    write_wan_loras(loaded_wan_i2v.pipe, folder, I2V_CASES)
    write_wan_loras(loaded_wan_i2v.pipe, folder, (T2V_CASE,))
    return folder


@pytest.fixture
def i2v_engine(family_engine, i2v_loras):
    return family_engine(Family.WAN_I2V, i2v_loras)


def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0):
    return diffusers_frames(
        tiny_dir, folder, weight_name, scale, pipeline_class=WanImageToVideoPipeline, image=example_image()
    )


def test_the_tiny_pipeline_is_wan_image_to_video_and_every_request_brings_an_image(loaded_wan_i2v, i2v_engine):
    pipe = loaded_wan_i2v.pipe
    assert type(pipe) is WanImageToVideoPipeline and family_spec(MODEL_ID) is FAMILY
    assert pipe.transformer.config.in_channels == 36 and pipe.transformer.config.added_kv_proj_dim
    defaults = loaded_wan_i2v.defaults
    assert defaults.video and defaults.needs_image and defaults.modes == ("image-to-image",)
    assert (defaults.num_frames, defaults.fps, defaults.strength) == (FRAMES, 16, None)
    with pytest.raises(InvalidRequestError, match=r"image-to-video\): a request needs an image") as caught:
        generate(i2v_engine, request(image=None))
    assert caught.value.status == 400


def test_an_image_to_video_lora_is_told_by_its_image_layers(i2v_loras):
    expected = [(case, Family.WAN_I2V) for case in I2V_CASES] + [(T2V_CASE, Family.WAN)]
    for case, family in expected:
        with safe_open(str(i2v_loras / case.file_name), "pt") as f:
            assert family_from_keys(list(f.keys())) is family, case.name


@pytest.mark.parametrize("case", (*I2V_CASES, T2V_CASE), ids=[c.name for c in (*I2V_CASES, T2V_CASE)])
def test_each_naming_matches_diffusers_image_to_video_on_every_frame(case, i2v_engine, i2v_loras, tiny_wan_i2v_dir):
    base = reference(tiny_wan_i2v_dir, i2v_loras, None)
    result = generate(i2v_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    theirs = reference(tiny_wan_i2v_dir, i2v_loras, case.reference_name, 0.8)
    assert result.is_video and len(result.frames) == FRAMES and result.request.mode == "image-to-image"
    assert np.abs(pixels(theirs[-1]) - pixels(base[-1])).mean() > 1, "the LoRA must visibly change the video"
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"{case.name}: frame {index}")


def test_the_base_is_bit_exact_after_swaps(i2v_engine, loaded_wan_i2v, pristine_wan_i2v):
    for case in (*I2V_CASES, T2V_CASE, I2V_CASES[0]):
        generate(i2v_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.7), steps=1))
        with pytest.raises(InvalidRequestError):
            generate(i2v_engine, request(LoraSpec(f"local:{case.file_name}"), steps=1, image=None))
    i2v_engine.restore_base_weights()
    names = ("transformer", "text_encoder", "image_encoder", "vae")
    assert_components_pristine(loaded_wan_i2v.pipe, pristine_wan_i2v, names)
