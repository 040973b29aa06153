"""Wan 2.1 text-to-video on the tiny Wan pipeline: a result is a video (every frame, in order, at the pool's
rate); every LoRA naming diffusers' Wan loader reads gives diffusers' own video (load_lora_weights + fuse_lora)
within 2 levels per channel on every frame; dropped deltas and wrong widths are refused naming them; the base is
bit-exact after swaps and refusals; progress per step and cancel as for images. The family's files:
families/wan.py, engine/families/wan.py, engine/families/tiny_wan.py."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanPipeline

from engine.errors import (
    GenerationCancelledError,
    IncompatibleLoraError,
    InvalidRequestError,
    UnsupportedLoraVariantError,
)
from engine.families.registry import family_spec
from engine.families.wan import FAMILY
from engine.requests import GenerateRequest, LoraSpec
from families.wan import MODEL_ID
from lora_catalog.bases import family_from_keys
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.images import assert_images_close
from tests.support.wan import (
    CASES,
    DIFF_CASE,
    FRAMES,
    MODULES,
    PROMPT,
    diffusers_frames,
    lora_file,
    write_wan_loras,
)


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def wan_loras(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-loras")
    write_wan_loras(loaded_wan.pipe, folder)
    # Made for a wider Wan (64 wide, where the tiny one is 44): its factors fit no served layer.
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in MODULES[:2]}
    save_lora(folder / "wan_wide.safetensors", lora_file(wide, "peft", None))
    return folder


@pytest.fixture
def wan_engine(family_engine, wan_loras):
    return family_engine(Family.WAN, wan_loras)


def test_the_tiny_wan_pipeline_has_wans_structure_and_makes_videos(loaded_wan):
    pipe = loaded_wan.pipe
    assert type(pipe) is WanPipeline and loaded_wan.family is FAMILY and family_spec(MODEL_ID) is FAMILY
    assert loaded_wan.components == ("transformer",)
    assert type(pipe.text_encoder).__name__ == "UMT5EncoderModel" and pipe.vae.config.z_dim == 16
    defaults = loaded_wan.defaults
    assert defaults.video and (defaults.num_frames, defaults.fps, defaults.frame_multiple) == (5, 16, 4)
    assert defaults.is_tiny and defaults.side_multiple == 16 and defaults.guidance_2 is None
    assert defaults.modes == ("text-to-image",)
    assert sum(p.numel() for p in pipe.transformer.parameters()) < 200_000


def test_a_wan_lora_is_told_by_its_names_in_every_naming(wan_loras):
    from safetensors import safe_open

    for case in CASES:
        with safe_open(str(wan_loras / case.file_name), "pt") as f:
            assert family_from_keys(list(f.keys())) is Family.WAN, case.name


def test_without_a_lora_the_video_is_diffusers_own_frame_by_frame(wan_engine, wan_loras, tiny_wan_dir):
    result = generate(wan_engine, request())
    reference = diffusers_frames(tiny_wan_dir, wan_loras, None)
    assert result.is_video and len(result.frames) == FRAMES and result.fps == 16
    assert result.image is result.frames[0] and result.more_images == ()
    for index, (ours, theirs) in enumerate(zip(result.frames, reference, strict=True)):
        assert_images_close(pixels(ours), pixels(theirs), f"frame {index}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_wan_naming_matches_diffusers_fuse_on_every_frame(case, wan_engine, wan_loras, tiny_wan_dir):
    base = diffusers_frames(tiny_wan_dir, wan_loras, None)
    result = generate(wan_engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    reference = diffusers_frames(tiny_wan_dir, wan_loras, case.reference_name, 0.8)
    assert np.abs(pixels(reference[-1]) - pixels(base[-1])).mean() > 2, "the LoRA must visibly change the video"
    for index, (ours, theirs) in enumerate(zip(result.frames, reference, strict=True)):
        assert_images_close(pixels(ours), pixels(theirs), f"{case.name}: frame {index}")


def test_dropped_deltas_and_wrong_widths_are_refused_naming_them(wan_engine, loaded_wan, pristine_wan):
    """Norm and full-weight `.diff` deltas (ComfyUI's, lightx2v's), which diffusers drops: a 400 naming them
    (bias deltas, which diffusers applies, run: test_wan_deltas.py)."""
    with pytest.raises(UnsupportedLoraVariantError, match=r"uses full weight differences") as caught:
        wan_engine.check_lora(LoraSpec(f"local:{DIFF_CASE.file_name}"))
    assert caught.value.status == 400
    with pytest.raises(IncompatibleLoraError, match=r"factors \(64, 2\) x \(2, 64\) do not fit transformer\.blocks"):
        wan_engine.check_lora(LoraSpec("local:wan_wide.safetensors"))
    wan_engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))


def test_the_base_is_bit_exact_after_swaps_and_refusals(wan_engine, loaded_wan, pristine_wan):
    refs = [f"local:{c.file_name}" for c in CASES[:3]]
    for index, ref in enumerate([*refs, *reversed(refs)]):
        generate(wan_engine, request(LoraSpec(ref, scale=0.5 + index / 10), steps=1))
        with pytest.raises((IncompatibleLoraError, InvalidRequestError)):
            generate(wan_engine, request(LoraSpec(f"local:{DIFF_CASE.file_name}"), steps=1))
        with pytest.raises(InvalidRequestError, match="4k"):
            generate(wan_engine, request(LoraSpec(ref), steps=1, num_frames=4))
    wan_engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))


def test_progress_per_step_and_cancel_as_for_images(wan_engine):
    seen: list[tuple[int, int]] = []
    cancel = threading.Event()

    def progress(step: int, total: int) -> None:
        seen.append((step, total))
        cancel.set()

    generate(wan_engine, request(steps=2), progress=lambda s, t: seen.append((s, t)))
    assert seen == [(1, 2), (2, 2)]
    seen.clear()
    with pytest.raises(GenerationCancelledError):
        generate(wan_engine, request(steps=3), progress=progress, cancel=cancel)
    # Cancelled after the first step: it stops at a next step's end, never running all three.
    assert seen[0] == (1, 3) and (3, 3) not in seen
