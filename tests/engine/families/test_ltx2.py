"""LTX-2 on the tiny LTX-2 pipeline: a result is a video (every frame, in order, at the pool's rate) with its sound;
every LoRA naming diffusers' LTX-2 loader reads, on the transformer and the connectors, gives diffusers' own video
and sound (load_lora_weights + fuse_lora) within 2 levels per channel on every frame and within float rounding on
every audio sample, and a request with an image gives what diffusers' LTX2ImageToVideoPipeline does; wrong widths
are refused naming them; the base is bit-exact after swaps and refusals; the frame rule (8k+1) and the side rule
(multiples of 32) are refused by name before anything runs. The family's files: families/ltx2.py,
engine/families/ltx2.py, ltx2_memory.py, tiny_ltx2.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import LTX2Pipeline

from engine.errors import IncompatibleLoraError, InvalidRequestError, LimitExceededError
from engine.families.ltx2 import FAMILY
from engine.families.registry import family_spec
from engine.requests import GenerateRequest, LoraSpec
from families.ltx2 import MODEL_ID, MODEL_ID_2_3
from lora_catalog.bases import family_from_keys
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.image_inputs import example_image, input_image
from tests.support.ltx2 import (
    AUDIO_TOLERANCE,
    CASES,
    FPS,
    FRAMES,
    PROMPT,
    STEPS,
    TRANSFORMER,
    assert_same_video,
    diffusers_video,
    write_ltx2_loras,
)

_COMPONENTS = ("transformer", "connectors", "text_encoder", "vae", "audio_vae", "vocoder")


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": STEPS, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ltx2_loras(loaded_ltx2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ltx2-loras")
    write_ltx2_loras(loaded_ltx2.pipe, folder)
    # Made for a wider LTX-2 (64 wide, where the tiny one is 84): its factors fit no served layer.
    wide = {f"{m}.lora_A.weight": torch.ones(2, 64) for m in TRANSFORMER[:2]}
    wide |= {f"{m}.lora_B.weight": torch.ones(64, 2) for m in TRANSFORMER[:2]}
    save_lora(folder / "ltx2_wide.safetensors", wide)
    return folder


@pytest.fixture
def ltx2_engine(family_engine, ltx2_loras):
    return family_engine(Family.LTX2, ltx2_loras)


def test_the_tiny_ltx2_pipeline_has_ltx2s_structure_and_makes_videos_with_sound(loaded_ltx2):
    pipe = loaded_ltx2.pipe
    assert type(pipe) is LTX2Pipeline and loaded_ltx2.family is FAMILY
    assert family_spec(MODEL_ID) is FAMILY and family_spec(MODEL_ID_2_3) is FAMILY
    assert loaded_ltx2.components == ("transformer", "connectors")
    assert type(pipe.text_encoder).__name__ == "Gemma3ForConditionalGeneration"
    assert (pipe.vae_spatial_compression_ratio, pipe.vae_temporal_compression_ratio) == (32, 8)
    defaults = loaded_ltx2.defaults
    assert defaults.video and (defaults.num_frames, defaults.fps, defaults.frame_multiple) == (FRAMES, FPS, 8)
    assert defaults.side_multiple == 32 and defaults.modes == ("text-to-image", "image-to-image")
    assert defaults.is_tiny and (FAMILY.defaults(pipe).steps, defaults.guidance) == (30, 3.0)


def test_an_ltx2_lora_is_told_by_its_names_in_every_naming(ltx2_loras):
    from safetensors import safe_open

    for case in CASES:
        with safe_open(str(ltx2_loras / case.file_name), "pt") as f:
            assert family_from_keys(list(f.keys())) is Family.LTX2, case.name


def test_without_a_lora_the_video_and_sound_are_diffusers_own(ltx2_engine, ltx2_loras, tiny_ltx2_dir):
    result = generate(ltx2_engine, request())
    assert result.is_video and result.fps == FPS and result.image is result.frames[0]
    assert_same_video(result, diffusers_video(tiny_ltx2_dir, ltx2_loras, None), "base")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_ltx2_naming_matches_diffusers_on_every_frame_and_sample(case, ltx2_engine, ltx2_loras, tiny_ltx2_dir):
    base = diffusers_video(tiny_ltx2_dir, ltx2_loras, None)
    result = generate(ltx2_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    reference = diffusers_video(tiny_ltx2_dir, ltx2_loras, case.file_name, 0.8)
    assert np.abs(pixels(reference.frames[-1]) - pixels(base.frames[-1])).mean() > 2, "the LoRA must show"
    assert (reference.audio - base.audio).abs().max() > 10 * AUDIO_TOLERANCE, "the LoRA must change the sound"
    assert_same_video(result, reference, case.name)


@pytest.mark.parametrize("case", [None, CASES[0]], ids=["base", "lora"])
def test_image_to_video_matches_diffusers_ltx2_image_to_video_pipeline(case, ltx2_engine, ltx2_loras, tiny_ltx2_dir):
    """A request with an image runs LTX2ImageToVideoPipeline over the pool's own components, the image its first
    frame: diffusers' own pipeline of that class, with the same inputs and the LoRA fused, gives the same video and
    sound."""
    loras = () if case is None else (LoraSpec(f"local:{case.file_name}", scale=0.8),)
    result = generate(ltx2_engine, request(*loras, image=input_image()))
    assert result.request.mode == "image-to-image" and result.is_video
    name = None if case is None else case.file_name
    reference = diffusers_video(tiny_ltx2_dir, ltx2_loras, name, 0.8, image=example_image())
    text_only = generate(ltx2_engine, request(*loras))
    assert np.abs(pixels(text_only.frames[0]) - pixels(reference.frames[0])).mean() > 2, "the image must show"
    assert_same_video(result, reference, f"image-to-video {case.name if case else 'base'}")


def test_the_base_is_bit_exact_after_swaps_and_refusals(ltx2_engine, loaded_ltx2, pristine_ltx2):
    refs = [f"local:{c.file_name}" for c in CASES]
    for index, ref in enumerate(refs):
        generate(ltx2_engine, request(LoraSpec(ref, scale=0.5 + index / 10), steps=1))
        with pytest.raises(IncompatibleLoraError, match=r"do not fit transformer\.transformer_blocks"):
            generate(ltx2_engine, request(LoraSpec("local:ltx2_wide.safetensors"), steps=1))
        with pytest.raises(InvalidRequestError, match="8k"):
            generate(ltx2_engine, request(LoraSpec(ref), steps=1, num_frames=10))
    ltx2_engine.restore_base_weights()
    assert_components_pristine(loaded_ltx2.pipe, pristine_ltx2, _COMPONENTS)


def test_a_lora_made_for_ltx2_3_runs_on_an_ltx2_pool_with_a_warning_naming_it(ltx2_engine, ltx2_loras):
    """Its metadata names LTX-2.3 (ModelSpec's architecture): it runs, and the result says it was made for the
    other version (users report such LoRAs misbehave)."""
    from safetensors.torch import load_file

    tensors = load_file(str(ltx2_loras / CASES[0].file_name))
    save_lora(ltx2_loras / "ltx2_3.safetensors", tensors, {"modelspec.architecture": "ltx-2.3"})
    result = generate(ltx2_engine, request(LoraSpec("local:ltx2_3.safetensors"), steps=1))
    assert any(f"made for LTX-2.3 22B ({MODEL_ID_2_3})" in w and MODEL_ID in w for w in result.warnings)
    # Without metadata, its tensors tell LTX-2.0 by the connectors' `text_proj_in` (2.3 has per-modality ones): no
    # note on an LTX-2 pool. A LoRA of the blocks alone cannot tell the versions apart (they share names): it says so.
    plain = generate(ltx2_engine, request(LoraSpec(f"local:{CASES[0].file_name}"), steps=1))
    assert not any("made for LTX-2.3" in w or "cannot tell" in w for w in plain.warnings), plain.warnings
    blocks = generate(ltx2_engine, request(LoraSpec(f"local:{CASES[2].file_name}"), steps=1))
    assert any("cannot tell LTX-2 19B from LTX-2.3 22B" in w for w in blocks.warnings), blocks.warnings


def test_the_frame_side_and_token_rules_are_refused_by_name_before_a_run(ltx2_engine):
    """diffusers' call never refuses a count (10 frames quietly give 9); the gate does, naming each rule."""
    with pytest.raises(InvalidRequestError, match=r"num_frames=10 is not of the form 8k\+1.*e\.g\. 9 or 17"):
        generate(ltx2_engine, request(num_frames=10))
    with pytest.raises(InvalidRequestError, match="multiple of 32"):
        generate(ltx2_engine, request(width=80))
    # 81 frames at 4 fps are 20.25 s, longer than LTX-2 makes (20 s: 80 frames, 73 by the 8k+1 rule).
    assert ltx2_engine.defaults.max_seconds == 20.0
    with pytest.raises(LimitExceededError, match=r"num_frames=81 at fps=4 is 20.2 s, .* at most 73 frames"):
        generate(ltx2_engine, request(num_frames=81, fps=4))
