"""A Wan pool's sizes and frames as loading gives them (`ModelDefaults`), from its base's one declaration
(`engine.families.wan_memory`): the 720P bases (Wan 2.1 T2V-14B, I2V-720P, Wan 2.2 A14B) take 1280 x 720, the 480P
ones keep twice 480; every pool carries the size its memory plan is made for (the gate's token bound); its default
and most frames are within MAX_VIDEO_FRAMES, so that the UI's slider, `/pool_status` and a share link offer what a
request may ask.

The pools are tiny Wan folders loaded as real ones are (`from_pretrained`), their VAE's config without the tiny
side it states, so each reads as its checkpoint's: Wan's 480 side and 81 frames, TI2V-5B's 704 and 121.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from engine.errors import LimitExceededError
from engine.families import tiny_wan, wan_i2v
from engine.normalise import normalise_request
from engine.pipeline.loading import load_pipeline
from engine.pools.needs import loaded_need
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from families.wan import MODEL_ID, MODEL_ID_5B, MODEL_ID_14B
from families.wan22 import MODEL_ID as A14B
from families.wan_i2v import MODEL_ID as I2V_480P
from families.wan_i2v import MODEL_ID_720P as I2V_720P
from serving.ui import session
from serving.ui.video_ui import video_controls
from tests.support.image_inputs import input_image

BUILDERS: dict[str, Callable[[int], Any]] = {
    "t2v": tiny_wan.build_tiny_pipeline,
    "i2v": tiny_wan.build_tiny_i2v_pipeline,
    "a14b": tiny_wan.build_tiny_a14b_pipeline,
    "ti2v": tiny_wan.build_tiny_ti2v_pipeline,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny Wan saved as a folder whose VAE states no side of its own."""
    made = {}
    for name, build in BUILDERS.items():
        folder = tmp_path_factory.mktemp(f"wan-{name}") / "pipeline"
        build(0).save_pretrained(folder)
        config = folder / "vae" / "config.json"
        values = json.loads(config.read_text())
        values.pop("sample_size")
        config.write_text(json.dumps(values))
        made[name] = folder
    return made


def defaults_of(folder: Path, base: str, **changes: object) -> ModelDefaults:
    settings = Settings(model_id=str(folder), base_model_id=base, device="cpu", dtype="float32", **changes)
    return load_pipeline(settings, warm=False).defaults


def check(defaults: ModelDefaults, limits: Limits | None = None, **fields: object):
    limits = limits or Limits(max_loras=1, max_steps=50, max_prompt_chars=100)
    request = GenerateRequest(**({"prompt": "a fox", "steps": 2} | fields))  # type: ignore[arg-type]
    return normalise_request(request, defaults, limits)


@pytest.mark.parametrize(("kind", "base"), [("t2v", MODEL_ID_14B), ("i2v", I2V_720P), ("a14b", A14B)])
def test_a_720p_base_takes_its_cards_1280_x_720(folders, kind, base):
    defaults = defaults_of(folders[kind], base)
    assert defaults.side == 480 and defaults.max_side == 1280
    assert defaults.video_plan == (81, 1280, 720)
    # As the cluster and a remote Space send them: JSON lists, read back as the same frozen defaults.
    assert ModelDefaults(**json.loads(json.dumps(dataclasses.asdict(defaults)))) == defaults
    # The UI offers the card's size both ways, after Wan's buckets at the 480 side.
    assert defaults.sizes == ((480, 480), (832, 480), (480, 832), (624, 624), (1280, 720), (720, 1280))
    # An image-to-video pool's request brings its first frame.
    image = input_image(1280, 720) if kind == "i2v" else None
    checked = check(defaults, width=1280, height=720, num_frames=81, image=image)
    assert (checked.width, checked.height, checked.num_frames) == (1280, 720, 81)


@pytest.mark.parametrize(("kind", "base"), [("t2v", MODEL_ID), ("i2v", I2V_480P)])
def test_a_480p_base_keeps_twice_480_and_its_plan_bounds_the_tokens(folders, kind, base):
    defaults = defaults_of(folders[kind], base)
    assert defaults.max_side == 960 and defaults.video_plan == (81, 832, 480)
    assert defaults.sizes == ((480, 480), (832, 480), (480, 832), (624, 624))
    fields = {"width": 960, "height": 960, "image": input_image(960, 960) if kind == "i2v" else None}
    with pytest.raises(LimitExceededError, match=r"at 960x960 is 75600 video tokens, more than the 32760"):
        check(defaults, **fields)
    assert check(defaults, num_frames=33, **fields).num_frames == 33


def test_ti2v_5bs_121_frames_are_capped_by_max_video_frames_once_at_load(folders):
    """The issue's case: a TI2V-5B pool's default (121 frames) over MAX_VIDEO_FRAMES (81) made the UI's default
    Generate send 121 frames, which the gate then refused."""
    assert defaults_of(folders["ti2v"], MODEL_ID_5B, max_video_frames=1001).num_frames == 121
    settings = Settings(max_video_frames=81)
    defaults = defaults_of(folders["ti2v"], MODEL_ID_5B)
    assert (defaults.num_frames, defaults.max_frames, defaults.side, defaults.max_side) == (81, 81, 704, 1408)
    assert defaults.video_plan == (121, 1280, 704)
    # The UI's slider and a share link offer what the gate takes; its default Generate is accepted.
    with gr.Blocks():
        controls = video_controls(defaults)
    assert (controls.frames.value, controls.frames.maximum) == (81, 81)
    assert session.video_values({"num_frames": "121"}, defaults) == (None, None)
    assert check(defaults, Limits.of(settings), num_frames=controls.frames.value).num_frames == 81
    # A MAX_VIDEO_FRAMES off the 4k+1 form gives the largest 4k+1 under it, the default within it too.
    lower = defaults_of(folders["ti2v"], MODEL_ID_5B, max_video_frames=50)
    assert (lower.num_frames, lower.max_frames) == (49, 49)


def test_a_loaded_720p_pool_is_planned_with_its_bases_working_memory(folders):
    """Once loaded, the plan measures the weights; the working memory stays its base's (720P's, not the family's
    480P reference)."""
    settings = Settings(model_id=str(folders["i2v"]), base_model_id=I2V_720P, device="cpu", dtype="float32")
    need = loaded_need(load_pipeline(settings, warm=False), rank=8)
    assert need.working == wan_i2v.FAMILY.memory_of(I2V_720P).working_bytes > wan_i2v.FAMILY.memory.working_bytes


@pytest.mark.parametrize(
    ("kind", "base"),
    [
        ("t2v", MODEL_ID),
        ("i2v", I2V_480P),
        ("t2v", MODEL_ID_14B),
        ("i2v", I2V_720P),
        ("a14b", A14B),
        ("ti2v", MODEL_ID_5B),
    ],
)
def test_every_size_the_ui_offers_is_taken_at_the_default_frames(folders, kind, base):
    """Wan's buckets were rounded to 64 (832 x 512, 640 x 640): over a 480P plan's tokens at 81 frames."""
    defaults = defaults_of(folders[kind], base)
    for width, height in defaults.sizes:
        image = input_image(width, height) if kind == "i2v" else None
        assert check(defaults, width=width, height=height, image=image).num_frames == defaults.num_frames
