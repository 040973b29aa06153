"""Wan LoRAs carrying `.diff` / `.diff_b` deltas: what diffusers 0.42.1's Wan converter
(`_convert_non_diffusers_wan_lora_to_diffusers`) does with each, read from diffusers itself, and the engine's
answer: a 400 naming the delta tensors, never a silent drop (docs/usage.md, "Wan LoRAs with .diff keys").

diffusers loads a block layer's `.diff_b` as PEFT's `lora_B.bias` (a bias delta its fuse adds) and drops a norm's
`.diff`/`.diff_b` and a Linear's full-weight `.diff` (but the head's) with a log line. The exact swap changes
Linear weights only, so it can neither equal diffusers on a bias delta nor apply a dropped delta as diffusers
would (diffusers does not apply it): both are refused by name, and the base stays bit-exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from safetensors.torch import load_file

from engine.errors import UnsupportedLoraVariantError
from engine.requests import LoraSpec
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.dit import assert_components_pristine, pixels
from tests.support.wan import DIFF_CASE, MODULES, diffusers_frames, factors, lora_file, write_wan_loras

BIAS, BIAS_KEY = "wan_bias_delta.safetensors", "diffusion_model.blocks.0.self_attn.q.diff_b"
DROPPED = (
    "diffusion_model.blocks.0.norm3.diff",
    "diffusion_model.blocks.0.norm3.diff_b",
    "diffusion_model.blocks.1.self_attn.norm_q.diff",
    "diffusion_model.blocks.1.self_attn.q.diff",
)


@pytest.fixture(scope="module")
def delta_loras(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wan-deltas")
    write_wan_loras(loaded_wan.pipe, folder, (DIFF_CASE,))
    with_bias = lora_file(factors(loaded_wan.pipe.transformer, MODULES[:2], seed=3), "comfy", 2.0)
    with_bias[BIAS_KEY] = torch.full((44,), 2.0)
    save_lora(folder / BIAS, with_bias)
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


def test_the_engine_refuses_every_delta_naming_it_and_the_base_stays_exact(
    family_engine, delta_loras, loaded_wan, pristine_wan
):
    engine = family_engine(Family.WAN, delta_loras)
    for name, keys in ((BIAS, (BIAS_KEY,)), (DIFF_CASE.file_name, DROPPED)):
        with pytest.raises(UnsupportedLoraVariantError, match=r"uses full weight differences") as caught:
            engine.check_lora(LoraSpec(f"local:{name}"))
        assert caught.value.status == 400 and all(key in str(caught.value) for key in keys), str(caught.value)
        # Without its deltas the same file runs.
        engine.check_lora(LoraSpec(f"local:plain_{name}"))
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer", "text_encoder", "vae"))
