"""The one check of a request's video fields (`engine.normalise` via `engine.video_checks`): frames of the form
4k+1 within the pool's maximum and MAX_VIDEO_FRAMES, fps within FPS_RANGE, the low-noise guidance on a two-stage
pool, video fields refused on an image pool, and an image where (and only where) the pool takes one; every
refusal names the value and what is accepted."""

from __future__ import annotations

import dataclasses

import pytest

from engine.compare import CompareLimits, CompareRequest, plan_cells
from engine.errors import InvalidRequestError, LimitExceededError
from engine.families.wan_memory import MEMORY_1_3B
from engine.normalise import normalise_request
from engine.requests import FPS_RANGE, GenerateRequest, Limits, LoraSpec, ModelDefaults
from engine.settings import Settings
from tests.support.image_inputs import input_image, input_mask

LIMITS = Limits(max_loras=4, max_steps=50, max_prompt_chars=200)
IMAGE_POOL = ModelDefaults(steps=4, guidance=1.0, side=64, max_side=128)


def video_pool(
    *, modes: tuple = ("text-to-image",), guidance_2: float | None = None, max_frames: int = 0
) -> ModelDefaults:
    return ModelDefaults(
        steps=4,
        guidance=5.0,
        side=32,
        max_side=64,
        side_multiple=16,
        modes=modes,
        needs_image=modes == ("image-to-image",),
        max_reference_images=int("image-to-image" in modes),
        video=True,
        num_frames=9,
        fps=16,
        max_frames=max_frames,
        guidance_2=guidance_2,
    )


T2V, I2V, TI2V = (
    video_pool(),
    video_pool(modes=("image-to-image",)),
    video_pool(modes=("text-to-image", "image-to-image")),
)
A14B = video_pool(guidance_2=3.0)


def check(defaults: ModelDefaults, limits: Limits = LIMITS, **fields: object):
    return normalise_request(GenerateRequest(**({"prompt": "a cat walks"} | fields)), defaults, limits)  # type: ignore[arg-type]


def test_a_video_request_takes_the_pools_defaults_and_what_it_sets():
    checked = check(T2V)
    assert (checked.num_frames, checked.fps, checked.guidance_2) == (9, 16, None)
    checked = check(A14B, num_frames=17, fps=24, guidance_2=4.0)
    assert (checked.num_frames, checked.fps, checked.guidance_2) == (17, 24, 4.0)
    assert check(A14B).guidance_2 == 3.0
    # An image request's video fields stay empty.
    assert (check(IMAGE_POOL).num_frames, check(IMAGE_POOL).fps, check(IMAGE_POOL).guidance_2) == (0, 0, None)


@pytest.mark.parametrize("frames", [2, 4, 8, 80])
def test_frames_off_4k_plus_1_are_refused_naming_the_rule(frames):
    with pytest.raises(InvalidRequestError, match=rf"num_frames={frames} is not of the form 4k\+1 .*accepted: 4k\+1"):
        check(T2V, num_frames=frames)


def test_frames_over_max_video_frames_or_the_pools_maximum_are_refused_naming_which():
    with pytest.raises(LimitExceededError, match=r"num_frames=85 is over what this Space's MAX_VIDEO_FRAMES allows"):
        check(T2V, num_frames=85)
    capped = Limits.of(Settings(max_video_frames=40))
    assert capped.max_video_frames == 40
    with pytest.raises(LimitExceededError, match=r"MAX_VIDEO_FRAMES allows; accepted: 4k\+1 frames from 1 to 37"):
        check(T2V, capped, num_frames=41)
    with pytest.raises(LimitExceededError, match=r"over what this pool's model allows; accepted: .* to 33"):
        check(video_pool(max_frames=33), num_frames=37)
    assert check(T2V, num_frames=81).num_frames == 81 and check(T2V, num_frames=1).num_frames == 1
    # A pool's default over a lower MAX_VIDEO_FRAMES is brought down to the largest allowed.
    assert check(T2V, Limits.of(Settings(max_video_frames=6))).num_frames == 5


@pytest.mark.parametrize(("fps", "error"), [(FPS_RANGE[0] - 1, InvalidRequestError), (61, LimitExceededError)])
def test_fps_out_of_range_is_refused_naming_the_range(fps, error):
    with pytest.raises(error, match=rf"fps={fps} is out of range; accepted: an integer from 4 to 60"):
        check(T2V, fps=fps)


@pytest.mark.parametrize(("name", "value"), [("num_frames", 9), ("fps", 16), ("guidance_2", 3.0)])
def test_video_fields_on_an_image_pool_are_refused(name, value):
    with pytest.raises(InvalidRequestError, match=rf"{name}={value!r} was given, but this pool's model makes images"):
        check(IMAGE_POOL, **{name: value})


def test_guidance_2_on_a_one_stage_video_pool_is_ignored_with_a_warning():
    checked = check(T2V, guidance_2=2.0)
    assert any("guidance_2 does not apply" in w for w in T2V.ignored(checked))
    with pytest.raises(InvalidRequestError, match=r"guidance_2=31 is out of range"):
        check(A14B, guidance_2=31)


def test_an_image_to_video_pool_needs_an_image_and_a_text_to_video_pool_takes_none():
    with pytest.raises(InvalidRequestError, match=r"image-to-video\): a request needs an image; accepted: an image"):
        check(I2V)
    with pytest.raises(InvalidRequestError, match=r"text-to-video only; accepted: a prompt without an image"):
        check(T2V, image=input_image(64, 64))
    assert check(I2V, image=input_image(64, 64)).mode == "image-to-image"
    assert check(TI2V).mode == "text-to-image" and check(TI2V, image=input_image(64, 64)).num_frames == 9


def test_a_video_pool_makes_one_video_and_takes_no_mask():
    with pytest.raises(InvalidRequestError, match=r"num_images=2 is not accepted on a video pool; accepted: 1"):
        check(T2V, num_images=2)
    with pytest.raises(InvalidRequestError, match=r"mask_image was given to a video pool; accepted: no mask"):
        check(I2V, image=input_image(64, 64), mask_image=input_mask(64, 64))


def test_a_low_noise_scale_of_its_own_is_taken_on_a_two_transformer_pool_only():
    pair = (LoraSpec("someone/wan-lora", scale=0.8, scale_2=0.5),)
    with pytest.raises(InvalidRequestError, match=r"scale_2=0.5 of someone/wan-lora was given, but this pool's model"):
        check(T2V, loras=pair)
    assert check(A14B, loras=pair).loras == pair
    same = (LoraSpec("someone/wan-lora", scale=0.8, scale_2=0.8),)
    assert check(A14B, loras=same).loras == (LoraSpec("someone/wan-lora", scale=0.8),)
    assert check(T2V, loras=same).loras == (LoraSpec("someone/wan-lora", scale=0.8),)
    with pytest.raises(InvalidRequestError, match=r"scale_2 of someone/wan-lora=3 is out of range"):
        check(A14B, loras=(LoraSpec("someone/wan-lora", scale_2=3.0),))


# A Wan 2.1 1.3B pool as its declaration plans it (`engine.families.wan_memory`): 81 frames at 832x480, sides in
# 16s up to 960.
WAN_1_3B = ModelDefaults(
    steps=4,
    guidance=5.0,
    side=480,
    max_side=MEMORY_1_3B.largest_side,
    side_multiple=16,
    video=True,
    num_frames=81,
    fps=16,
    max_frames=81,
    video_plan=MEMORY_1_3B.video_size,
)


def test_a_video_over_the_tokens_its_pool_was_planned_for_is_refused_naming_the_most_frames_and_the_largest_size():
    # The case: 81 x 960 x 960 is 2.3 times the 32760 tokens of 81 x 832 x 480.
    refusal = (
        r"num_frames=81 at 960x960 is 75600 video tokens, more than the 32760 this pool's memory plan is made for "
        r"\(81 frames at 832x480\); accepted: at 960x960 at most 33 frames, or at 81 frames at most 624x624"
    )
    with pytest.raises(LimitExceededError, match=refusal):
        check(WAN_1_3B, width=960, height=960)
    # What it names is accepted, and one step over either is not.
    assert check(WAN_1_3B, num_frames=33, width=960, height=960).num_frames == 33
    assert check(WAN_1_3B, width=624, height=624).num_frames == 81
    with pytest.raises(LimitExceededError, match=r"at 960x960 at most 33 frames"):
        check(WAN_1_3B, num_frames=37, width=960, height=960)
    with pytest.raises(LimitExceededError, match=r"at 81 frames at most 624x624"):
        check(WAN_1_3B, width=640, height=640)
    # The planned size either way round; a wider one keeps its aspect in what is named.
    assert check(WAN_1_3B, width=480, height=832).num_frames == check(WAN_1_3B, width=832, height=480).num_frames
    # (60 x 34 patches a latent frame: 16 of them fit, 61 frames; at 21 latent frames 1560 patches, 52 x 29.)
    with pytest.raises(LimitExceededError, match=r"at 960x544 at most 61 frames, or at 81 frames at most 832x464"):
        check(WAN_1_3B, width=960, height=544)
    assert check(WAN_1_3B, width=832, height=464).num_frames == 81
    assert check(WAN_1_3B, num_frames=61, width=960, height=544).num_frames == 61
    # An image-to-video request's size from its image is held the same way.
    i2v = dataclasses.replace(WAN_1_3B, modes=("image-to-image",), needs_image=True, max_reference_images=1)
    with pytest.raises(LimitExceededError, match=r"at 960x960 is 75600 video tokens"):
        check(i2v, image=input_image(960, 960))
    # An image pool and a pool without a plan have no such bound.
    assert check(dataclasses.replace(WAN_1_3B, video_plan=()), width=960, height=960).num_frames == 81


def test_an_image_door_refuses_a_video_pool_and_the_video_door_an_image_pool_before_running():
    with pytest.raises(InvalidRequestError, match=r"this endpoint answers images, but this pool's model makes videos"):
        check(T2V, expects="image")
    named = dataclasses.replace(IMAGE_POOL, base_model="owner/sdxl")
    with pytest.raises(InvalidRequestError, match=r"answers videos, but this pool's model \(owner/sdxl\) makes images"):
        check(named, expects="video")
    with pytest.raises(InvalidRequestError, match=r"expects='gif' is not accepted; accepted: 'image', 'video' or none"):
        check(T2V, expects="gif")
    # Each door on its own kind, and a door that answers either (POST /, the UI) on both.
    assert check(T2V, expects="video").num_frames == 9 and check(IMAGE_POOL, expects="image").num_frames == 0
    assert check(T2V).num_frames == 9 and check(IMAGE_POOL).num_frames == 0
    # A checked request keeps it (a comparison's cells are checked again).
    assert check(IMAGE_POOL, expects="image").expects == "image"
    # A comparison is a grid of images, from the UI's Compare and /compare alike.
    grid = CompareRequest("a cat walks", loras=(LoraSpec("someone/wan-lora"),))
    with pytest.raises(InvalidRequestError, match=r"this endpoint answers images, but this pool's model makes videos"):
        plan_cells(grid, T2V, LIMITS, CompareLimits(max_cells=4, max_steps=100))
    assert [c.request.expects for c in plan_cells(grid, IMAGE_POOL, LIMITS, CompareLimits(4, 100))] == ["image"]


def test_a_pool_loaded_under_max_video_frames_names_the_setting_not_its_model():
    # Loading caps a pool's most frames at MAX_VIDEO_FRAMES' largest 4k+1 (50: 49).
    capped = Limits.of(Settings(max_video_frames=50))
    with pytest.raises(LimitExceededError, match=r"over what this Space's MAX_VIDEO_FRAMES allows; accepted: .* to 49"):
        check(video_pool(max_frames=49), capped, num_frames=53)
