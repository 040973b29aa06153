"""Wan 2.2 T2V-A14B on the tiny two-transformer Wan: a single LoRA file goes to both transformers (the high-noise
`transformer` and the low-noise `transformer_2`), equal to diffusers loading it into each
(`load_into_transformer_2=True` for the low-noise side) and fusing both, within 2 levels per channel on every
frame; loaded into one side alone diffusers' video differs; both transformers bit-exact after swaps. The family's
files: families/wan22.py, engine/families/wan22.py (Wan's names and converter: families/wan_names.py,
engine/families/wan.py; its tiny builder: engine/families/tiny_wan.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from diffusers import WanPipeline

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.families.origin import check_origin, judge_origin
from engine.families.registry import family_spec
from engine.families.wan22 import FAMILY
from engine.requests import GenerateRequest, LoraSpec
from families.wan import MODEL_ID_14B as WAN_14B
from families.wan22 import MODEL_ID
from lora_catalog.entries import Family
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.images import assert_images_close
from tests.support.wan import CASES, FRAMES, PROMPT, diffusers_frames, write_wan_loras

BOTH = ("transformer", "transformer_2")


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def a14b_loras(loaded_wan22, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan22-loras")
    write_wan_loras(loaded_wan22.pipe, folder, CASES)
    return folder


@pytest.fixture
def a14b_engine(family_engine, a14b_loras):
    return family_engine(Family.WAN22, a14b_loras)


def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, sides=BOTH):
    return diffusers_frames(tiny_dir, folder, weight_name, scale, sides=sides, guidance_2=3.0)


def test_the_tiny_pipeline_has_two_transformers_switched_at_the_boundary(loaded_wan22):
    pipe = loaded_wan22.pipe
    assert type(pipe) is WanPipeline and family_spec(MODEL_ID) is FAMILY and loaded_wan22.components == BOTH
    assert pipe.config.boundary_ratio == 0.875 and pipe.transformer_2 is not pipe.transformer
    defaults = loaded_wan22.defaults
    assert defaults.video and defaults.two_stage and (defaults.guidance, defaults.guidance_2) == (4.0, 3.0)


def test_without_a_lora_the_video_is_diffusers_own(a14b_engine, a14b_loras, tiny_wan22_dir):
    result = generate(a14b_engine, request())
    assert result.request.guidance_2 == 3.0 and len(result.frames) == FRAMES
    theirs = reference(tiny_wan22_dir, a14b_loras, None)
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"frame {index}")


@pytest.mark.parametrize("case", CASES[:4], ids=[c.name for c in CASES[:4]])
def test_one_file_goes_to_both_transformers_as_diffusers_loads_it_into_each(
    case, a14b_engine, a14b_loras, tiny_wan22_dir
):
    result = generate(a14b_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    theirs = reference(tiny_wan22_dir, a14b_loras, case.file_name, 0.8)
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"{case.name}: frame {index}")
    if case is CASES[0]:
        # Loaded into either side alone, diffusers' video is another one: both sides took it.
        for side in BOTH:
            one = reference(tiny_wan22_dir, a14b_loras, case.file_name, 0.8, sides=(side,))
            assert np.abs(pixels(one[-1]) - pixels(theirs[-1])).mean() > 0.5, side


def test_each_side_takes_its_own_scale_as_diffusers_fuses_each_transformer_with_its_own(
    a14b_engine, a14b_loras, tiny_wan22_dir
):
    name = CASES[0].file_name
    result = generate(a14b_engine, request(LoraSpec(f"local:{name}", scale=0.9, scale_2=0.3)))
    sides = {"transformer": (name, 0.9), "transformer_2": (name, 0.3)}
    theirs = diffusers_frames(tiny_wan22_dir, a14b_loras, None, guidance_2=3.0, per_side=sides)
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"frame {index}")
    # One scale for both is another video: the low-noise side took its own.
    same = reference(tiny_wan22_dir, a14b_loras, name, 0.9)
    assert np.abs(pixels(same[-1]) - pixels(theirs[-1])).mean() > 0.5


def test_side_scales_swap_and_both_transformers_stay_bit_exact(a14b_engine, loaded_wan22, pristine_wan22):
    for index, case in enumerate((*CASES[:3], CASES[0])):
        generate(a14b_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.5 + index / 10), steps=1))
        generate(a14b_engine, request(LoraSpec(f"local:{CASES[0].file_name}", scale_2=0.2 + index / 10), steps=1))
    with pytest.raises(InvalidRequestError, match=r"scale_2 of local:wan_peft.safetensors=3 is out of range"):
        generate(a14b_engine, request(LoraSpec(f"local:{CASES[0].file_name}", scale_2=3.0), steps=1))
    a14b_engine.restore_base_weights()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, (*BOTH, "text_encoder", "vae"))


def test_a_wan_2_1_lora_is_allowed_on_an_a14b_pool_with_a_warning_and_another_familys_is_refused():
    def unread() -> tuple[dict, dict]:
        raise AssertionError("the card decides")

    warning = check_origin("LoRA 'x'", judge_origin([WAN_14B], unread), MODEL_ID)
    assert warning is not None and f"made for {WAN_14B}, which no pool here serves; it runs on {MODEL_ID}" in warning
    assert check_origin("LoRA 'x'", judge_origin([WAN_14B], unread), WAN_14B) is None
    with pytest.raises(IncompatibleLoraError, match=r"made for Qwen/Qwen-Image \(qwen_image\)") as caught:
        check_origin("LoRA 'x'", judge_origin(["Qwen/Qwen-Image"], unread), MODEL_ID)
    assert caught.value.status == 400
