"""Wan 2.2 A14B's pairs: a local folder holding a `*high_noise*` and a `*low_noise*` file is one LoRA, each file on
its transformer, equal to diffusers loading the high file into `transformer` and the low one with
`load_into_transformer_2=True` (each fused), within 2 levels per channel on every frame; a single file whose name
says its side in an explicit form goes to that transformer alone, with a warning naming the stage that gets
nothing; a file whose name or metadata merely holds a capital HIGH or LOW goes to both; a pair of one base twice,
halves of different bases, and a pair named twice are 400s, with both transformers bit-exact after."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.families.wan22 import stage_of
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.entries import Family
from serving.recipes import recipe_text
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.images import assert_images_close
from tests.support.wan import CASES, PROMPT, diffusers_frames, write_wan_loras

BOTH = ("transformer", "transformer_2")
HIGH, LOW = "style_high_noise.safetensors", "style_low_noise.safetensors"
# A style and a slider's setting, not stages: each file goes to both transformers.
FASHION, SLIDER = "HIGH_FASHION_style.safetensors", "detail_slider.safetensors"


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


def _copy(source: Path, target: Path, metadata: dict[str, str] | None = None) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if metadata is None:
        shutil.copyfile(source, target)
    else:
        save_file(load_file(source), target, metadata=metadata)


@pytest.fixture(scope="module")
def pairs(loaded_wan22, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan22-pairs")
    write_wan_loras(loaded_wan22.pipe, folder, CASES[:2])
    high, low = folder / CASES[0].file_name, folder / CASES[1].file_name
    _copy(high, folder / "pair" / HIGH)
    _copy(low, folder / "pair" / LOW)
    _copy(high, folder / HIGH)
    _copy(high, folder / "twice" / HIGH)
    _copy(low, folder / "twice" / "style_HIGH_NOISE.safetensors")
    _copy(high, folder / FASHION)
    _copy(high, folder / SLIDER, {"modelspec.title": "Detail Slider (LOW)"})
    _copy(high, folder / "bases" / HIGH, {"modelspec.architecture": "wan2.2-t2v-a14b"})
    _copy(low, folder / "bases" / LOW, {"modelspec.architecture": "wan2.1-t2v-1.3b"})
    return folder


@pytest.fixture
def engine(family_engine, pairs):
    return family_engine(Family.WAN22, pairs)


def frames_close(ours, theirs, what: str) -> None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_images_close(pixels(a), pixels(b), f"{what}: frame {index}")


def test_the_names_say_the_side_in_explicit_forms_only():
    lightning = "Wan2.2-Lightning_T2V-A14B-4steps-lora_LOW_fp16.safetensors"
    names = (HIGH, LOW, lightning, "Wan2.2-High-Noise", FASHION, "x-LOW.safetensors", "low_light.safetensors")
    assert [stage_of(n, {}) for n in names] == [0, 1, 1, 0, None, None, None]
    assert stage_of("x.safetensors", {"ss_output_name": "wan22_low_noise"}) == 1
    assert stage_of(SLIDER, {"modelspec.title": "Detail Slider (LOW)"}) is None


def test_a_pair_is_one_lora_each_file_on_its_transformer_as_diffusers_loads_them(engine, pairs, tiny_wan22_dir):
    result = generate(engine, request(LoraSpec("local:pair", scale=0.8)))
    sides = {"transformer": (HIGH, 0.8), "transformer_2": (LOW, 0.8)}
    theirs = diffusers_frames(tiny_wan22_dir, pairs / "pair", None, guidance_2=3.0, per_side=sides)
    frames_close(result.frames, theirs, "pair")
    assert result.adapters[0].files == f"high: {HIGH}, low: {LOW}"
    assert f'Lora pairs: "~pair (high: {HIGH}, low: {LOW})"' in recipe_text(result)
    # Each half alone is another video.
    for half in (f"local:pair/{HIGH}", f"local:pair/{LOW}"):
        alone = generate(engine, request(LoraSpec(half, scale=0.8)))
        assert np.abs(pixels(alone.frames[-1]) - pixels(result.frames[-1])).mean() > 0.5, half


def test_a_single_file_named_high_noise_goes_to_the_high_noise_transformer_alone(engine, pairs, tiny_wan22_dir):
    result = generate(engine, request(LoraSpec(f"local:{HIGH}", scale=0.8)))
    sides = {"transformer": (HIGH, 0.8)}
    frames_close(result.frames, diffusers_frames(tiny_wan22_dir, pairs, None, guidance_2=3.0, per_side=sides), HIGH)
    said = f"LoRA 'local:{HIGH}': its name says it is a high-noise file ({HIGH}), so it runs on the high-noise"
    assert [w for w in result.warnings if said in w and "the low-noise stage gets nothing of it" in w], result.warnings
    # A cache hit says it again (the warning is kept with the adapter).
    assert [w for w in generate(engine, request(LoraSpec(f"local:{HIGH}"))).warnings if said in w]


@pytest.mark.parametrize("name", [FASHION, SLIDER])
def test_a_capital_high_or_low_that_is_no_stage_goes_to_both_transformers(engine, pairs, tiny_wan22_dir, name):
    result = generate(engine, request(LoraSpec(f"local:{name}", scale=0.8)))
    sides = dict.fromkeys(BOTH, (name, 0.8))
    frames_close(result.frames, diffusers_frames(tiny_wan22_dir, pairs, None, guidance_2=3.0, per_side=sides), name)
    assert not [w for w in result.warnings if "stage gets nothing" in w], result.warnings


def test_bad_pairs_are_refused_and_both_transformers_stay_bit_exact(engine, loaded_wan22, pristine_wan22):
    generate(engine, request(LoraSpec("local:pair", scale=0.7, scale_2=0.4), steps=1))
    twice = r"not one high-noise and one low-noise .*style_HIGH_NOISE.safetensors: high"
    with pytest.raises(InvalidRequestError, match=twice):
        generate(engine, request(LoraSpec("local:twice"), steps=1))
    with pytest.raises(IncompatibleLoraError, match=r"its halves are of different bases") as caught:
        generate(engine, request(LoraSpec("local:bases"), steps=1))
    assert caught.value.status == 400
    with pytest.raises(InvalidRequestError, match=r"LoRA 'local:pair' is listed twice"):
        generate(engine, request(LoraSpec("local:pair"), LoraSpec("local:pair", scale=0.5), steps=1))
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, (*BOTH, "text_encoder", "vae"))
