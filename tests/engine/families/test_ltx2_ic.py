"""LTX-2's IC-LoRAs on the tiny LTX-2 pool: a request with a reference video (`GenerateRequest.reference_video`,
an MP4 read to its header at the door) runs on diffusers' `LTX2InContextPipeline` built from the pool's own
components, and its video and sound equal diffusers' in-context pipeline with the IC-LoRA fused (load_lora_weights +
fuse_lora) on every frame and audio sample, with an image too (its first frame, diffusers' `conditions`); a bad
reference video is refused by its rule before anything is decoded, and the pool serves the same afterwards."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from diffusers import LTX2InContextPipeline, LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition
from PIL import Image

from engine import video_references
from engine.errors import InvalidRequestError, LimitExceededError
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, LoraSpec, ModelDefaults
from engine.video_input import EncodedVideo, encoded_video
from engine.video_references import TRAINED_DOWNSCALE_KEY
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from serving.video import decode_mp4
from tests.engine.families.test_ltx2 import request
from tests.support.checks import generate
from tests.support.dit import pixels
from tests.support.image_inputs import example_image, input_image, input_mask
from tests.support.ltx2 import (
    CASES,
    Reference,
    assert_same_video,
    diffusers_call,
    factors,
    lora_file,
    write_ltx2_loras,
)
from tests.support.reference_video import reference_mp4

IC_LORA = CASES[0].file_name
# IC_LORA's factors, with the reference downscale they were "trained" with in their metadata as each name says; and
# another LoRA's (CASES[1]) trained at 1, to disagree.
TRAINED_2, MALFORMED, OTHER_1 = "ic_trained_2.safetensors", "ic_trained_two.safetensors", "ic_trained_1.safetensors"


def header(data: bytes) -> EncodedVideo:
    """The MP4 as a door carries it: read as far as its header."""
    return encoded_video(data, what="parameters.video", max_pixels=10**6, max_frames=81)


@pytest.fixture(scope="module")
def ic_loras(loaded_ltx2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ltx2-ic-loras")
    write_ltx2_loras(loaded_ltx2.pipe, folder, CASES[:1])
    for name, case, factor in ((TRAINED_2, CASES[0], "2"), (MALFORMED, CASES[0], "two"), (OTHER_1, CASES[1], "1")):
        made = lora_file(factors(loaded_ltx2.pipe, case.modules, seed=case.seed), case.fmt)
        save_lora(folder / name, made, {TRAINED_DOWNSCALE_KEY: factor})
    return folder


@pytest.fixture
def ic_engine(family_engine, ic_loras):
    return family_engine(Family.LTX2, ic_loras)


def diffusers_in_context(
    tiny_dir: Path, folder: Path, video: bytes, scale: float, image: Image.Image | None = None, **settings: Any
) -> Reference:
    """diffusers' own: its in-context pipeline over a pipeline of its own (from_pipe), the IC-LoRA loaded and fused
    (transformer and connectors), the reference video's frames (decoded by PyAV) as its one reference condition,
    and `image` (if any) as its frame-0 condition at diffusers' defaults; `settings`: further call arguments."""
    pipe: Any = LTX2InContextPipeline.from_pipe(LTX2Pipeline.from_pretrained(tiny_dir))
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(folder), weight_name=IC_LORA, adapter_name="ic")
    pipe.fuse_lora(components=["transformer", "connectors"], lora_scale=scale, adapter_names=["ic"])
    return diffusers_call(
        pipe,
        reference_conditions=[LTX2ReferenceCondition(frames=list(decode_mp4(video).frames))],
        **({} if image is None else {"conditions": [LTX2VideoCondition(frames=image, index=0)]}),
        **settings,
    )


def test_an_ic_lora_with_its_reference_video_is_diffusers_in_context_pipeline(
    ic_engine, ic_loras, tiny_ltx2_dir, loaded_ltx2
):
    video = reference_mp4()
    lora = LoraSpec(f"local:{IC_LORA}", scale=0.8)
    plain = generate(ic_engine, request(lora))
    result = generate(ic_engine, request(lora, reference_video=header(video)))
    reference = diffusers_in_context(tiny_ltx2_dir, ic_loras, video, 0.8)
    assert np.abs(pixels(plain.frames[-1]) - pixels(reference.frames[-1])).mean() > 1, "the reference must show"
    assert_same_video(result, reference, "in-context")
    # The in-context pipeline was the run's own: the pool still serves text-to-video, the same video as before.
    assert type(loaded_ltx2.pipe) is LTX2Pipeline
    _assert_same_frames(generate(ic_engine, request(lora)), plain)


def test_a_reference_video_with_an_image_is_diffusers_in_context_pipeline_with_its_first_frame(
    ic_engine, ic_loras, tiny_ltx2_dir, loaded_ltx2
):
    """The image is the video's first frame, as in image-to-video: diffusers' in-context call with the same reference
    condition and the image as its frame-0 `LTX2VideoCondition`; the base serves the same video after it."""
    video = reference_mp4()
    lora = LoraSpec(f"local:{IC_LORA}", scale=0.8)
    plain = generate(ic_engine, request(lora))
    without = generate(ic_engine, request(lora, reference_video=header(video)))
    result = generate(ic_engine, request(lora, reference_video=header(video), image=input_image()))
    assert result.request.mode == "image-to-image" and result.request.reference_video is not None
    reference = diffusers_in_context(tiny_ltx2_dir, ic_loras, video, 0.8, image=example_image())
    assert np.abs(pixels(without.frames[0]) - pixels(reference.frames[0])).mean() > 2, "the image must show"
    assert_same_video(result, reference, "in-context with an image")
    assert type(loaded_ltx2.pipe) is LTX2Pipeline
    _assert_same_frames(generate(ic_engine, request(lora)), plain)


def test_the_in_context_settings_reach_diffusers_call(ic_engine, ic_loras, tiny_ltx2_dir):
    """`reference_strength` and `reference_downscale` are diffusers' `conditioning_attention_strength` and
    `reference_downscale_factor`: the result equals its in-context call with them (and differs from the defaults')."""
    video = reference_mp4()
    lora = LoraSpec(f"local:{IC_LORA}", scale=0.8)
    settings = {"reference_strength": 0.25, "reference_downscale": 2}
    default = generate(ic_engine, request(lora, reference_video=header(video)))
    result = generate(ic_engine, request(lora, reference_video=header(video), **settings))
    assert (result.request.reference_strength, result.request.reference_downscale) == (0.25, 2)
    reference = diffusers_in_context(
        tiny_ltx2_dir, ic_loras, video, 0.8, conditioning_attention_strength=0.25, reference_downscale_factor=2
    )
    assert np.abs(pixels(default.frames[-1]) - pixels(reference.frames[-1])).mean() > 1, "the settings must show"
    assert_same_video(result, reference, "in-context settings")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reference_strength": 0.5}, r"reference_strength=0\.5 was given without a reference video; accepted: "),
        ({"reference_downscale": 2}, r"reference_downscale=2 was given without a reference video; accepted: "),
        ({"video": True, "reference_strength": 1.5}, r"reference_strength=1\.5 is out of range; accepted: a number "),
        ({"video": True, "reference_strength": "x"}, r"reference_strength='x' is not a number; accepted: "),
        ({"video": True, "reference_downscale": 1.5}, r"reference_downscale=1\.5 is not an integer; accepted: an "),
        ({"video": True, "reference_downscale": 0}, r"reference_downscale=0 is out of range; accepted: an integer "),
        ({"video": True, "reference_downscale": 3}, r"reference_downscale=3 does not divide the video's 64x64 "),
    ],
)
def test_bad_in_context_settings_are_refused_before_anything_runs(fields, message, loaded_ltx2):
    """Each a 400 naming the value and what is accepted, from the one check (the tiny LTX-2 pool's: sides in
    multiples of 32), before the video is decoded."""
    decoded: list[object] = []
    video = header(reference_mp4()) if fields.pop("video", False) else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(video_references, "decode_video", decoded.append)
        with pytest.raises(InvalidRequestError, match=message):
            normalise_request(request(reference_video=video, **fields), loaded_ltx2.defaults, Limits(4, 50, 1000))
    assert decoded == []


def _assert_same_frames(result: Any, expected: Any) -> None:
    assert [pixels(f).tobytes() for f in result.frames] == [pixels(f).tobytes() for f in expected.frames]
    assert np.array_equal(result.audio.samples, expected.audio.samples)


def test_each_bad_reference_video_is_refused_by_its_rule_and_the_pool_serves_the_same(ic_engine):
    """Refused where every request is checked (frames past MAX_VIDEO_FRAMES, a clip past the pool's longest, a frame
    past MAX_INPUT_PIXELS, with a mask: no inpainting), before it is decoded; the next request gets what it got
    before."""
    lora = LoraSpec(f"local:{IC_LORA}")
    before = generate(ic_engine, request(lora))
    long = encoded_video(reference_mp4(frames=90, side=32), what="parameters.video", max_pixels=10**6, max_frames=1001)
    with pytest.raises(LimitExceededError, match=r"parameters\.video is too long: 90 frames.*at most 81 frames"):
        generate(ic_engine, request(lora, reference_video=long))
    large = encoded_video(reference_mp4(side=64), what="parameters.video", max_pixels=10**6, max_frames=81)
    large = replace(large, width=4096, height=4096)  # a header that claims what no pool decodes
    with pytest.raises(LimitExceededError, match="has too many pixels: 4096x4096"):
        generate(ic_engine, request(lora, reference_video=large))
    forever = replace(large, width=64, height=64, seconds=3600.0)
    with pytest.raises(LimitExceededError, match=r"is too long: 3600.00 s.*at most 20 s"):
        generate(ic_engine, request(lora, reference_video=forever))
    masked = request(lora, reference_video=header(reference_mp4()), image=input_image(), mask_image=input_mask())
    with pytest.raises(InvalidRequestError, match=r"mask_image was given to a video pool; accepted: no mask"):
        generate(ic_engine, masked)
    _assert_same_frames(generate(ic_engine, request(lora)), before)


def test_a_reference_video_is_refused_on_a_pool_without_an_in_context_pipeline():
    defaults = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128, base_model="tiny-sd15")
    video = header(reference_mp4())
    with pytest.raises(InvalidRequestError, match=r"this pool \(tiny-sd15\) has no in-context pipeline; accepted: "):
        normalise_request(GenerateRequest(prompt="a fox", reference_video=video), defaults, Limits(4, 50, 1000))


def _label(name: str) -> str:
    return f"LoRA 'local:{name}' (file '{name}')"


def test_an_ic_loras_trained_downscale_is_the_default_of_a_request_that_sets_none(ic_engine):
    """An IC-LoRA whose metadata says it was trained at `reference_downscale_factor` 2: a request that sets no
    `reference_downscale` runs at 2 (the same video as one that sets 2, another than at 1; its request, what the
    recipe records, says 2 and where it came from), with the LoRAs' defaults off too; one that sets 1 runs at 1,
    with a warning naming the trained 2."""
    video = header(reference_mp4())
    lora = LoraSpec(f"local:{TRAINED_2}", scale=0.8)
    unset = generate(ic_engine, request(lora, reference_video=video))
    two = generate(ic_engine, request(lora, reference_video=video, reference_downscale=2))
    one = generate(ic_engine, request(lora, reference_video=video, reference_downscale=1))
    assert (unset.request.reference_downscale, two.request.reference_downscale) == (2, 2)
    where = f"{_label(TRAINED_2)}'s metadata ({TRAINED_DOWNSCALE_KEY})"
    assert dict(unset.request.defaults_from)["reference_downscale"] == where
    _assert_same_frames(unset, two)
    assert np.abs(pixels(one.frames[-1]) - pixels(two.frames[-1])).mean() > 1, "the factor must show"
    differs = f"reference_downscale=1 differs from the 2 {_label(TRAINED_2)} was trained with (its metadata's "
    assert [w for w in one.warnings if "reference_downscale" in w] == [
        f"{differs}{TRAINED_DOWNSCALE_KEY}); ran at 1 as asked"
    ]
    assert not [w for w in (*unset.warnings, *two.warnings) if "reference_downscale" in w]
    with ic_engine.prepare(request(lora, reference_video=video, lora_defaults=False)) as prepared:
        assert prepared.request.reference_downscale == 2
    with ic_engine.prepare(request(lora)) as prepared:  # no reference video: nothing in context to set
        assert prepared.request.reference_downscale is None


def test_ic_loras_that_disagree_on_their_trained_downscale_are_refused_unless_the_request_sets_one(ic_engine):
    """Two IC-LoRAs trained at 2 and at 1: no factor is both's, so a request that sets none is a 400 naming both;
    one that sets 2 is prepared at 2, with a warning naming the other's 1."""
    video = header(reference_mp4())
    loras = (LoraSpec(f"local:{TRAINED_2}", scale=0.8), LoraSpec(f"local:{OTHER_1}", scale=0.5))
    said = rf"{re.escape(_label(TRAINED_2))} says 2 and {re.escape(_label(OTHER_1))} says 1"
    with pytest.raises(InvalidRequestError, match=rf"disagree on the reference downscale .*: {said}\); accepted: "):
        generate(ic_engine, request(*loras, reference_video=video))
    with ic_engine.prepare(request(*loras, reference_video=video, reference_downscale=2)) as prepared:
        assert prepared.request.reference_downscale == 2
        assert [w for w in prepared.warnings if "reference_downscale" in w] == [
            f"reference_downscale=2 differs from the 1 {_label(OTHER_1)} was trained with (its metadata's "
            f"{TRAINED_DOWNSCALE_KEY}); ran at 2 as asked"
        ]


def test_a_malformed_trained_downscale_is_refused_naming_the_file_and_the_pool_serves_the_same(ic_engine):
    """A 400 naming the file, the key and the value; the next request gets what it got before."""
    video = header(reference_mp4())
    lora = LoraSpec(f"local:{TRAINED_2}", scale=0.8)
    before = generate(ic_engine, request(lora, reference_video=video))
    refusal = rf"{re.escape(_label(MALFORMED))} has reference_downscale_factor='two' in its metadata, which is not "
    for downscale in (None, 1):
        bad = request(LoraSpec(f"local:{MALFORMED}"), reference_video=video, reference_downscale=downscale)
        with pytest.raises(InvalidRequestError, match=rf"{refusal}a whole number from 1 to 8; accepted: "):
            generate(ic_engine, bad)
    _assert_same_frames(generate(ic_engine, request(lora, reference_video=video)), before)
