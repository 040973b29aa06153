"""Wan 2.2 I2V-A14B on the tiny two-transformer image-to-video Wan: every request brings its image; every Wan
naming, one file on both transformers, equals diffusers' own WanImageToVideoPipeline loading it into each
(`load_into_transformer_2=True` for the low-noise side) and fusing both, within 2 levels per channel on every
frame; each side takes its own scale; a high/low pair goes each file to its transformer; both transformers
bit-exact after swaps and refusals; its LoRAs are routed by card, metadata and Civitai's label; a Wan 2.1 I2V
LoRA falls back to it with a warning, its image layers dropped as diffusers drops them. The family's
files: families/wan22_i2v.py, engine/families/wan22_i2v.py (Wan's names and converter: families/wan_names.py,
engine/families/wan.py, engine/families/wan22.py; its tiny builder: engine/families/tiny_wan.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanImageToVideoPipeline

from engine.errors import InvalidRequestError
from engine.families.origin import check_origin, judge_origin
from engine.families.registry import family_spec
from engine.families.wan22_i2v import FAMILY
from engine.requests import GenerateRequest, LoraSpec
from families.wan22 import MODEL_ID as T2V_A14B
from families.wan22_i2v import MODEL_ID
from lora_catalog.bases import family_from_metadata
from lora_catalog.civitai.bases import civitai_base
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.image_inputs import example_image, input_image
from tests.support.images import assert_images_close
from tests.support.wan import (
    CASES,
    FRAMES,
    I2V_MODULES,
    MODULES,
    PROMPT,
    diffusers_frames,
    factors,
    lora_file,
    write_wan_loras,
)

BOTH = ("transformer", "transformer_2")
HIGH, LOW = "style_high_noise.safetensors", "style_low_noise.safetensors"


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    # The reference's guidance (4 high-noise, 3 low-noise: tests.support.wan) rather than the pool's 3.5 and 3.5.
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "image": input_image()}
    values |= {"guidance": 4.0, "guidance_2": 3.0} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loras(loaded_wan22_i2v, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan22-i2v-loras")
    write_wan_loras(loaded_wan22_i2v.pipe, folder, CASES)
    (folder / "pair").mkdir()
    shutil.copyfile(folder / CASES[0].file_name, folder / "pair" / HIGH)
    shutil.copyfile(folder / CASES[1].file_name, folder / "pair" / LOW)
    return folder


@pytest.fixture
def engine(family_engine, loras):
    return family_engine(Family.WAN22_I2V, loras)


def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, **options):
    return diffusers_frames(
        tiny_dir,
        folder,
        weight_name,
        scale,
        pipeline_class=WanImageToVideoPipeline,
        image=example_image(),
        guidance_2=3.0,
        **({"sides": BOTH} | options),
    )


def frames_close(ours, theirs, what: str) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_images_close(pixels(a), pixels(b), f"{what}: frame {index}")


def test_the_tiny_pipeline_is_image_to_video_with_two_transformers_and_no_image_encoder(loaded_wan22_i2v, engine):
    pipe = loaded_wan22_i2v.pipe
    assert type(pipe) is WanImageToVideoPipeline and family_spec(MODEL_ID) is FAMILY
    assert loaded_wan22_i2v.components == BOTH and pipe.image_encoder is None
    assert pipe.config.boundary_ratio == 0.9 and pipe.transformer_2.config.in_channels == 36
    defaults = loaded_wan22_i2v.defaults
    assert defaults.video and defaults.two_stage and defaults.needs_image and defaults.modes == ("image-to-image",)
    assert (defaults.guidance, defaults.guidance_2, defaults.num_frames) == (3.5, 3.5, FRAMES)
    with pytest.raises(InvalidRequestError, match=r"image-to-video\): a request needs an image") as caught:
        generate(engine, request(image=None))
    assert caught.value.status == 400


def test_without_a_lora_the_video_is_diffusers_own(engine, loras, tiny_wan22_i2v_dir):
    result = generate(engine, request())
    assert result.is_video and len(result.frames) == FRAMES
    frames_close(result.frames, reference(tiny_wan22_i2v_dir, loras, None), "no LoRA")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_naming_goes_to_both_transformers_as_diffusers_loads_it_into_each(case, engine, loras, tiny_wan22_i2v_dir):
    result = generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    theirs = reference(tiny_wan22_i2v_dir, loras, case.file_name, 0.8)
    frames_close(result.frames, theirs, case.name)
    if case is CASES[0]:
        # Loaded into either side alone, diffusers' video is another one: both sides took it.
        for side in BOTH:
            one = reference(tiny_wan22_i2v_dir, loras, case.file_name, 0.8, sides=(side,))
            assert np.abs(pixels(one[-1]) - pixels(theirs[-1])).mean() > 0.5, side


def test_each_side_takes_its_own_scale_and_a_pair_goes_each_file_to_its_transformer(engine, loras, tiny_wan22_i2v_dir):
    name = CASES[0].file_name
    result = generate(engine, request(LoraSpec(f"local:{name}", scale=0.9, scale_2=0.3)))
    sides = {"transformer": (name, 0.9), "transformer_2": (name, 0.3)}
    frames_close(result.frames, reference(tiny_wan22_i2v_dir, loras, None, per_side=sides), "scale_2")
    pair = generate(engine, request(LoraSpec("local:pair", scale=0.8)))
    halves = {"transformer": (HIGH, 0.8), "transformer_2": (LOW, 0.8)}
    frames_close(pair.frames, reference(tiny_wan22_i2v_dir, loras / "pair", None, per_side=halves), "pair")
    assert pair.adapters[0].files == f"high: {HIGH}, low: {LOW}"


def test_both_transformers_stay_bit_exact_after_swaps_and_refusals(engine, loaded_wan22_i2v, pristine_wan22_i2v):
    for index, case in enumerate((*CASES[:3], CASES[0])):
        generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.5 + index / 10), steps=1))
        generate(engine, request(LoraSpec("local:pair", scale_2=0.2 + index / 10), steps=1))
        with pytest.raises(InvalidRequestError):
            generate(engine, request(LoraSpec(f"local:{case.file_name}"), steps=1, image=None))
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22_i2v.pipe, pristine_wan22_i2v, (*BOTH, "text_encoder", "vae"))


def test_its_loras_are_routed_by_card_metadata_and_civitai_label():
    label = civitai_base("Wan Video 2.2 I2V-A14B")
    assert label is not None and (label.base_model_id, label.family) == (MODEL_ID, Family.WAN22_I2V)
    assert family_from_metadata({"modelspec.architecture": "wan2.2-i2v-a14b"}) is Family.WAN22_I2V
    assert family_from_metadata({"ss_base_model_version": "wan2.2_i2v_a14b"}) is Family.WAN22_I2V

    def unread() -> tuple[dict, dict]:
        raise AssertionError("the card decides")

    assert check_origin("LoRA 'x'", judge_origin([MODEL_ID], unread), MODEL_ID) is None
    with pytest.raises(Exception, match=r"made for Wan-AI/Wan2.2-T2V-A14B-Diffusers \(wan22\)") as caught:
        check_origin("LoRA 'x'", judge_origin([T2V_A14B], unread), MODEL_ID)
    assert getattr(caught.value, "status", None) == 400


def fallback_lora(pipe, folder: Path, *, metadata: dict[str, str] | None) -> str:
    """A Wan 2.1 I2V 14B LoRA in ComfyUI's names, sized to the tiny A14B's blocks, with the image layers it lacks
    (each side's `k_img`, `v_img`, and the image embedder, sized as Wan 2.1 I2V's: 1280 wide image features)."""
    transformer = pipe.transformer
    width = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    made = factors(transformer, MODULES, seed=71)
    generator = torch.Generator().manual_seed(72)
    image = {f"blocks.{i}.attn2.{kv}": (width, width) for i in range(2) for kv in ("add_k_proj", "add_v_proj")}
    image |= {I2V_MODULES[-2]: (16, 16), I2V_MODULES[-1]: (16, width)}
    for module, (fan_in, fan_out) in image.items():
        made[module] = (torch.randn(4, fan_in, generator=generator), torch.randn(fan_out, 4, generator=generator))
    name = f"wan21_i2v_{'card' if metadata else 'bare'}.safetensors"
    save_lora(folder / name, lora_file(made, "comfy", 4.0), metadata)
    return name


def test_a_wan_2_1_i2v_lora_runs_on_both_transformers_without_its_image_layers_as_diffusers_drops_them(
    engine, loras, loaded_wan22_i2v, pristine_wan22_i2v, tiny_wan22_i2v_dir
):
    name = fallback_lora(loaded_wan22_i2v.pipe, loras, metadata={"modelspec.architecture": "wan2.1-i2v-14b"})
    result = generate(engine, request(LoraSpec(f"local:{name}", scale=0.8)))
    frames_close(result.frames, reference(tiny_wan22_i2v_dir, loras, name, 0.8), "Wan 2.1 I2V on A14B")
    fallback, dropped = result.warnings[-2:]
    assert f"was made for Wan I2V, which no pool here serves; it runs on {MODEL_ID}" in fallback
    assert "6 of its layers were not applied (16 tensors: diffusion_model.blocks.0.cross_attn.k_img" in dropped
    # Without a card or metadata its image layers name it (`families.wan_i2v`'s own): the same fallback.
    bare = fallback_lora(loaded_wan22_i2v.pipe, loras, metadata=None)
    unnamed = generate(engine, request(LoraSpec(f"local:{bare}", scale=0.8)))
    assert any("6 of its layers were not applied" in w for w in unnamed.warnings)
    frames_close(unnamed.frames, result.frames, "the same LoRA without metadata")
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22_i2v.pipe, pristine_wan22_i2v, (*BOTH, "text_encoder", "vae"))
