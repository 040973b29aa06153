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
from PIL import Image

from engine.errors import (
    GenerationCancelledError,
    IncompatibleLoraError,
    InvalidRequestError,
)
from engine.families.registry import family_spec
from engine.families.wan import FAMILY, LATENT_RGB, LATENT_RGB_5B, PREVIEW_FRAMES, unpack_latents
from engine.pipeline.preview import LinearPreview
from engine.requests import GenerateRequest, LoraSpec
from families.wan import MODEL_ID
from lora_catalog.bases import family_from_keys
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine, pixels
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


def test_wrong_widths_are_refused_naming_them_and_full_differences_run(wan_engine, loaded_wan, pristine_wan):
    """Norm and full-weight `.diff` deltas (ComfyUI's, lightx2v's), which diffusers drops, are applied
    (tests/engine/formats/test_full_differences.py); factors of another width are a 400 naming them."""
    wan_engine.check_lora(LoraSpec(f"local:{DIFF_CASE.file_name}"))
    with pytest.raises(IncompatibleLoraError, match=r"factors \(64, 2\) x \(2, 64\) do not fit transformer\.blocks"):
        wan_engine.check_lora(LoraSpec("local:wan_wide.safetensors"))
    wan_engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))


def test_the_base_is_bit_exact_after_swaps_and_refusals(wan_engine, loaded_wan, pristine_wan):
    # ComfyUI's file with norm and weight full differences among them: its norms go back exactly too.
    refs = [f"local:{c.file_name}" for c in (*CASES[:2], DIFF_CASE)]
    for index, ref in enumerate([*refs, *reversed(refs)]):
        generate(wan_engine, request(LoraSpec(ref, scale=0.5 + index / 10), steps=1))
        with pytest.raises(IncompatibleLoraError):
            generate(wan_engine, request(LoraSpec("local:wan_wide.safetensors"), steps=1))
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


# -- previews ----------------------------------------------------------------------------------------------------


def test_previews_are_a_strip_of_latent_frames_and_leave_the_video_as_it_is(loaded_wan, base_settings):
    """Each preview is the run's latent frames side by side through Wan 2.1's projection (5 frames: 2 latent
    frames of 8 x 8 at 64 px); the video made with previews is the one made without, byte for byte."""
    assert FAMILY.preview.projection is LATENT_RGB and len(LATENT_RGB.weights) == loaded_wan.pipe.vae.config.z_dim
    settings = base_settings.replace(base_model_id=MODEL_ID, preview_vae="none", preview_every=1)
    shown: list[tuple[int, Image.Image]] = []
    with local_engine(loaded_wan, settings) as engine:
        with engine.prepare(request()) as prepared:
            previewed = engine.run(prepared, preview=lambda step, image: shown.append((step, image)))
        with engine.prepare(request()) as prepared:
            plain = engine.run(prepared)
    latent_frames = (FRAMES - 1) // loaded_wan.pipe.vae_scale_factor_temporal + 1
    side = 64 // loaded_wan.pipe.vae_scale_factor_spatial
    assert [step for step, _ in shown] == [1, 2]
    assert all(image.size == (min(latent_frames, PREVIEW_FRAMES) * side, side) for _, image in shown)
    assert len(previewed.frames) == len(plain.frames) == FRAMES
    assert [f.tobytes() for f in previewed.frames] == [f.tobytes() for f in plain.frames]


def test_the_strip_takes_evenly_spaced_frames_and_the_channels_pick_the_projection():
    """81 frames are 21 latent frames: the strip shows 4 of them, first to last; TI2V-5B's 48-channel latents go
    through Wan 2.2's projection, latents no projection fits give no preview."""
    latents = torch.arange(21.0).view(1, 1, 21, 1, 1).expand(1, 2, 21, 3, 5)
    strip = unpack_latents(latents, 48, 80, 16)
    assert strip.shape == (1, 2, 3, 5 * PREVIEW_FRAMES)
    assert strip[0, 0, 0, ::5].tolist() == [0.0, 7.0, 13.0, 20.0]
    linear = LinearPreview(LATENT_RGB, Family.WAN, FAMILY.preview.more_projections)
    assert len(LATENT_RGB_5B.weights) == 48
    for channels in (16, 48):
        image = linear(torch.randn(1, channels, 6, 10, generator=torch.Generator().manual_seed(channels)), None)
        assert image is not None and image.size == (10, 6)
    assert linear(torch.zeros(1, 12, 6, 10), None) is None
