"""An LTX-2 pool's video tokens held to its memory plan (`engine.video_checks.check_tokens`), on the defaults loading
builds for it (`ModelDefaults`): frames 8k+1, sides in 32s, the plan's 121 frames at 768 x 512 (`MemorySpec.video_size`,
`engine.families.ltx2_memory`: 16 latent frames of 24 x 16 tokens, 6144). A request over them is a 400 naming the most
frames at its size and the largest size at its frames; what it names is taken.

The pool is a tiny LTX-2 folder loaded as a real one is (`from_pretrained`), its VAE's config without the tiny side
it states, so it reads as its checkpoint's (tests/engine/pipeline/test_video_defaults.py does the same for Wan)."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidRequestError, LimitExceededError
from engine.families.ltx2_memory import MEMORY
from engine.families.tiny_ltx2 import build_tiny_pipeline
from engine.normalise import normalise_request
from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.settings import Settings
from families.ltx2 import MODEL_ID

# The card's 121 frames (5 s at 24 fps), over MAX_VIDEO_FRAMES' default 81.
FRAMES = 121


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory) -> ModelDefaults:
    folder = tmp_path_factory.mktemp("ltx2") / "pipeline"
    build_tiny_pipeline().save_pretrained(folder)
    config = folder / "vae" / "config.json"
    values = json.loads(config.read_text())
    values.pop("sample_size")
    config.write_text(json.dumps(values))
    settings = Settings(
        model_id=str(folder), base_model_id=MODEL_ID, device="cpu", dtype="float32", max_video_frames=FRAMES
    )
    return load_pipeline(settings, warm=False).defaults


def check(defaults: ModelDefaults, **fields: object):
    request = GenerateRequest(**({"prompt": "a fox", "steps": 2} | fields))  # type: ignore[arg-type]
    return normalise_request(
        request, defaults, Limits(max_loras=1, max_steps=50, max_prompt_chars=100, max_video_frames=FRAMES)
    )


def test_loading_gives_an_ltx2_pool_its_frame_rule_side_multiple_and_plan(defaults):
    assert (defaults.frame_multiple, defaults.side_multiple) == (8, 32)
    assert defaults.video_plan == MEMORY.video_size == (121, 768, 512)
    assert (defaults.num_frames, defaults.max_side) == (FRAMES, 1024)
    assert check(defaults, width=768, height=512).num_frames == FRAMES  # the plan's own size fits exactly


def test_a_video_over_its_plans_tokens_is_a_400_naming_the_most_frames_and_the_largest_size(defaults):
    refusal = (
        r"num_frames=121 at 1024x1024 is 16384 video tokens, more than the 6144 this pool's memory plan is made for "
        r"\(121 frames at 768x512\); accepted: at 1024x1024 at most 41 frames, or at 121 frames at most 608x608"
    )
    with pytest.raises(LimitExceededError, match=refusal) as refused:
        check(defaults, width=1024, height=1024)
    assert refused.value.status == 400
    # What it names is taken, and the next 8k+1 or the next multiple of 32 is not.
    assert check(defaults, num_frames=41, width=1024, height=1024).num_frames == 41
    assert check(defaults, width=608, height=608).num_frames == FRAMES
    with pytest.raises(LimitExceededError, match=r"at 1024x1024 at most 41 frames"):
        check(defaults, num_frames=49, width=1024, height=1024)
    with pytest.raises(LimitExceededError, match=r"at 121 frames at most 608x608"):
        check(defaults, width=640, height=640)
    # The frame rule (8k+1) is checked before the tokens, naming its own rule.
    with pytest.raises(InvalidRequestError, match=r"num_frames=40 is not of the form 8k\+1"):
        check(defaults, num_frames=40, width=1024, height=1024)
