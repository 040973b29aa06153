"""Wan LoRAs carrying `.diff` / `.diff_b` deltas: what diffusers 0.42.1's Wan converter
(`_convert_non_diffusers_wan_lora_to_diffusers`) does with each, read from diffusers itself, and the engine's
answer (docs/usage.md).

diffusers loads a block layer's `.diff_b` as PEFT's `lora_B.bias` (a bias delta its fuse adds): the engine's
video equals diffusers' load_lora_weights + fuse_lora within 2 levels on every frame, on Wan 2.1 and on both
Wan 2.2 A14B transformers. diffusers drops a norm's `.diff`/`.diff_b` and a Linear's full-weight `.diff` (but the
head's) with a log line: the engine applies them as ComfyUI does (tests/engine/formats/test_full_differences.py
checks the video against diffusers with them added by hand), so its video differs from diffusers' own there.
Biases and weights bit-exact after."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from safetensors.torch import load_file

from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.images import assert_images_close
from tests.support.wan import DIFF_CASE, FRAMES, MODULES, PROMPT, diffusers_frames, factors, lora_file, write_wan_loras

BIAS, BIAS_KEY = "wan_bias_delta.safetensors", "diffusion_model.blocks.0.self_attn.q.diff_b"


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def delta_loras(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-deltas")
    write_wan_loras(loaded_wan.pipe, folder, (DIFF_CASE,))
    with_bias = lora_file(factors(loaded_wan.pipe.transformer, MODULES[:2], seed=3), "comfy", 2.0)
    with_bias[BIAS_KEY] = torch.full((44,), 2.0)
    save_lora(folder / BIAS, with_bias)
    lone = lora_file(factors(loaded_wan.pipe.transformer, MODULES[:2], seed=3), "comfy", 2.0)
    lone["diffusion_model.blocks.1.ffn.0.diff_b"] = torch.ones(48)
    save_lora(folder / "wan_lone_bias.safetensors", lone)
    # Each file without its deltas: what diffusers' video is compared with.
    for name in (DIFF_CASE.file_name, BIAS):
        tensors = load_file(folder / name)
        save_lora(folder / f"plain_{name}", {k: v for k, v in tensors.items() if not k.endswith((".diff", ".diff_b"))})
    return folder


def test_diffusers_loads_a_bias_delta_as_peft_lora_bias_and_drops_norm_and_weight_deltas(delta_loras, tiny_wan_dir):
    converted = WanPipeline.lora_state_dict(load_file(delta_loras / BIAS))
    assert torch.equal(converted["transformer.blocks.0.attn1.to_q.lora_B.bias"], torch.full((44,), 2.0))
    dropped = WanPipeline.lora_state_dict(load_file(delta_loras / DIFF_CASE.file_name))
    plain = WanPipeline.lora_state_dict(load_file(delta_loras / f"plain_{DIFF_CASE.file_name}"))
    assert dropped.keys() == plain.keys() and not any("norm" in k or k.endswith(".diff") for k in dropped)
    # Its videos say the same: the dropped deltas change nothing, the bias delta changes the video.
    for name, changes in ((DIFF_CASE.file_name, False), (BIAS, True)):
        theirs = diffusers_frames(tiny_wan_dir, delta_loras, name, 0.8)
        without = diffusers_frames(tiny_wan_dir, delta_loras, f"plain_{name}", 0.8)
        difference = np.abs(pixels(theirs[-1]) - pixels(without[-1])).mean()
        assert bool(difference > 0.1) == changes and (changes or difference == 0), (name, difference)


def test_a_bias_delta_is_added_to_the_bias_as_diffusers_fuses_it_on_every_frame(
    family_engine, delta_loras, tiny_wan_dir, loaded_wan, pristine_wan
):
    engine = family_engine(Family.WAN, delta_loras)
    result = generate(engine, request(LoraSpec(f"local:{BIAS}", scale=0.8)))
    theirs = diffusers_frames(tiny_wan_dir, delta_loras, BIAS, 0.8)
    without = diffusers_frames(tiny_wan_dir, delta_loras, f"plain_{BIAS}", 0.8)
    assert np.abs(pixels(theirs[-1]) - pixels(without[-1])).mean() > 0.1, "the bias delta must change the video"
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"frame {index}")
    generate(engine, request(LoraSpec(f"local:plain_{BIAS}", scale=0.5), steps=1))
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))


def test_a_bias_delta_goes_to_both_a14b_transformers_as_diffusers_loads_it_into_each(
    family_engine, loaded_wan22, pristine_wan22, tiny_wan22_dir, tmp_path
):
    with_bias = lora_file(factors(loaded_wan22.pipe.transformer, MODULES[:2], seed=3), "comfy", 2.0)
    with_bias[BIAS_KEY] = torch.full((36,), 2.0)
    save_lora(tmp_path / BIAS, with_bias)
    engine = family_engine(Family.WAN22, tmp_path)
    result = generate(engine, request(LoraSpec(f"local:{BIAS}", scale=0.8, scale_2=0.6)))
    sides = {"transformer": (BIAS, 0.8), "transformer_2": (BIAS, 0.6)}
    theirs = diffusers_frames(tiny_wan22_dir, tmp_path, None, guidance_2=3.0, per_side=sides)
    for index, (ours, expected) in enumerate(zip(result.frames, theirs, strict=True)):
        assert_images_close(pixels(ours), pixels(expected), f"frame {index}")
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, ("transformer", "transformer_2", "vae"))


def test_deltas_diffusers_drops_are_applied_and_the_base_stays_exact(
    family_engine, delta_loras, tiny_wan_dir, loaded_wan, pristine_wan
):
    engine = family_engine(Family.WAN, delta_loras)
    ours = generate(engine, request(LoraSpec(f"local:{DIFF_CASE.file_name}", scale=0.8)))
    plain = generate(engine, request(LoraSpec(f"local:plain_{DIFF_CASE.file_name}", scale=0.8)))
    # diffusers' video is the file's without its norm and weight deltas; the engine's is not (it applies them).
    theirs = diffusers_frames(tiny_wan_dir, delta_loras, DIFF_CASE.file_name, 0.8)
    assert_images_close(pixels(plain.frames[-1]), pixels(theirs[-1]), "without its deltas: diffusers' own")
    assert np.abs(pixels(ours.frames[-1]) - pixels(theirs[-1])).mean() > 0.1, "the deltas must change the video"
    # A bias delta of a layer the file has no factors for (which diffusers' PEFT has no layer to hold) runs too.
    generate(engine, request(LoraSpec("local:wan_lone_bias.safetensors"), steps=1))
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))
