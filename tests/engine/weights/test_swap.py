"""The swap against diffusers' own fuse. Exactness after many swaps with failures: tests/reliability/test_longrun.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionXLPipeline

from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate
from tests.support.images import assert_images_close

PROMPT = "a photo of a cat in sks style"


def request(*loras: LoraSpec, seed: int = 7, prompt: str = PROMPT) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=3, width=64, height=64, seed=seed)


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


def diffusers_image(tiny_dir, loras: list[tuple[str, str, float]], seed: int = 7, prompt: str = PROMPT):
    """The reference: a fresh pipeline, diffusers' load_lora_weights from the stand-in Hub, then fuse_lora."""
    pipe = StableDiffusionXLPipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    names = []
    for index, (repo_id, weight_name, _) in enumerate(loras):
        pipe.load_lora_weights(repo_id, weight_name=weight_name, adapter_name=f"a{index}", use_safetensors=True)
        names.append(f"a{index}")
    if len(loras) == 1:
        pipe.fuse_lora(lora_scale=loras[0][2])
    elif loras:
        pipe.set_adapters(names, adapter_weights=[scale for *_, scale in loras])
        pipe.fuse_lora(adapter_names=names)
    generator = torch.Generator("cpu").manual_seed(seed)
    return pipe(prompt=prompt, num_inference_steps=3, width=64, height=64, generator=generator).images[0]


def test_tiny_pipeline_is_deterministic_per_seed(engine):
    first = generate(engine, request(seed=1)).image
    again = generate(engine, request(seed=1)).image
    other = generate(engine, request(seed=2)).image
    assert first.size == (64, 64)
    assert first.tobytes() == again.tobytes()
    assert first.tobytes() != other.tobytes()


@pytest.mark.parametrize(
    ("role", "weight_name", "scale"),
    [
        ("peft", "pytorch_lora_weights.safetensors", 1.0),
        ("kohya", "ohwx_style.safetensors", 0.8),
        ("peft-noalpha", "pytorch_lora_weights.safetensors", 1.0),
    ],
)
def test_lora_matches_diffusers_fuse_and_changes_the_image(engine, fixtures, tiny_dir, role, weight_name, scale):
    repo_id = fixtures[role]
    base = pixels(generate(engine, request()).image)
    ours = pixels(generate(engine, request(LoraSpec(repo_id, scale=scale))).image)
    reference = pixels(diffusers_image(tiny_dir, [(repo_id, weight_name, scale)]))
    assert np.abs(reference - base).mean() > 2, "the fixture LoRA must visibly change the image"
    assert_images_close(ours, reference)
    assert np.abs(ours - reference).mean() < 0.1


# The reference loads a second adapter into the same diffusers pipeline on purpose; PEFT warns that it does.
@pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute:UserWarning")
def test_two_loras_blend_like_diffusers_weighted_adapters(engine, fixtures, tiny_dir):
    a = (fixtures["peft"], "pytorch_lora_weights.safetensors", 0.7)
    b = (fixtures["kohya"], "ohwx_style.safetensors", 0.5)
    ours = pixels(generate(engine, request(LoraSpec(a[0], scale=a[2]), LoraSpec(b[0], scale=b[2]))).image)
    only_a = pixels(generate(engine, request(LoraSpec(a[0], scale=a[2]))).image)
    reference = pixels(diffusers_image(tiny_dir, [a, b]))
    assert_images_close(ours, reference)
    assert np.abs(ours - only_a).mean() > 1


def test_scale_zero_gives_the_base_image(engine, fixtures):
    base = generate(engine, request()).image
    zero = generate(engine, request(LoraSpec(fixtures["peft"], scale=0.0))).image
    assert zero.tobytes() == base.tobytes()


def test_same_set_and_scales_again_is_no_work(engine, fixtures):
    first = generate(engine, request(LoraSpec(fixtures["peft"], scale=0.9)))
    second = generate(engine, request(LoraSpec(fixtures["peft"], scale=0.9), seed=8))
    third = generate(engine, request(LoraSpec(fixtures["peft"], scale=0.5), seed=8))
    assert first.swapped and not second.swapped and third.swapped
    assert second.timings.apply == 0.0
    assert [u.cache for u in (first.adapters[0], second.adapters[0])] == ["miss", "hit"]


def test_order_of_loras_does_not_change_the_image(engine, fixtures):
    a, b = LoraSpec(fixtures["peft"], scale=0.6), LoraSpec(fixtures["second"], scale=0.4)
    assert generate(engine, request(a, b)).image.tobytes() == generate(engine, request(b, a)).image.tobytes()


def test_local_lora_applies_like_the_same_file_from_the_hub(engine, fixtures):
    local = generate(engine, request(LoraSpec(fixtures.local["peft"])))
    base = generate(engine, request())
    assert local.adapters[0].ref == fixtures.local["peft"]
    assert np.abs(pixels(local.image) - pixels(base.image)).mean() > 1


def test_a_lora_without_a_declared_base_warns_on_every_use(engine, fixtures):
    first = generate(engine, request(LoraSpec(fixtures["no-base"])))
    again = generate(engine, request(LoraSpec(fixtures["no-base"]), seed=8))
    assert again.adapters[0].cache == "hit"
    for result in (first, again):
        assert any("declares no base model" in w for w in result.warnings)
