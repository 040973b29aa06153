"""SD 1.5 LoRAs on the tiny SD 1.5 pipeline, against diffusers' own load_lora_weights + fuse_lora."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionPipeline
from safetensors.torch import save_file

from engine.errors import IncompatibleLoraError
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from serving.demo.synthetic import (
    make_embeddings,
)
from tests.support.checks import generate
from tests.support.images import assert_images_close
from tests.support.loras import kohya_file
from tests.support.sd15 import write_sd15_loras

PROMPT = "a photo of a cat in sks style"


def request(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=tuple(loras), steps=3, width=64, height=64, seed=seed)


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


@pytest.fixture(scope="module")
def sd15_loras(loaded_sd15, loaded, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("sd15-loras")
    names = write_sd15_loras(loaded_sd15.pipe, folder)
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=53))
    return folder, names | {"sdxl": "sdxl_kohya.safetensors"}


@pytest.fixture
def sd15_engine(loaded_sd15, base_settings, sd15_loras):
    folder, _ = sd15_loras
    settings = base_settings.replace(local_lora_dir=folder)
    resolver = AdapterResolver(None, local_dir=folder, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded_sd15, settings, resolver)
    yield engine
    engine.close()


def diffusers_image(tiny_sd15_dir: Path, folder: Path, weight_name: str, scale: float):
    pipe = StableDiffusionPipeline.from_pretrained(tiny_sd15_dir, safety_checker=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
    pipe.fuse_lora(lora_scale=scale)
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(prompt=PROMPT, num_inference_steps=3, width=64, height=64, generator=generator).images[0]


def test_the_tiny_sd15_pipeline_has_sd15s_structure(loaded_sd15):
    pipe = loaded_sd15.pipe
    assert type(pipe) is StableDiffusionPipeline
    assert loaded_sd15.components == ("unet", "text_encoder")
    assert loaded_sd15.defaults.guidance == 7.5
    assert pipe.unet.down_blocks[0].attentions is not None
    assert isinstance(pipe.unet.down_blocks[0].attentions[0].proj_in, torch.nn.Conv2d)


@pytest.mark.parametrize(("role", "scale"), [("peft", 1.0), ("kohya", 0.8)])
def test_sd15_lora_matches_diffusers_fuse_and_changes_the_image(sd15_engine, sd15_loras, tiny_sd15_dir, role, scale):
    folder, names = sd15_loras
    base = pixels(generate(sd15_engine, request()).image)
    result = generate(sd15_engine, request(LoraSpec(f"local:{names[role]}", scale=scale)))
    ours = pixels(result.image)
    reference = pixels(diffusers_image(tiny_sd15_dir, folder, names[role], scale))
    assert np.abs(reference - base).mean() > 2, "the LoRA must visibly change the image"
    assert_images_close(ours, reference)
    assert np.abs(ours - reference).mean() < 0.1


def test_the_kohya_file_adapts_the_text_encoder_and_conv_layers(sd15_engine, sd15_loras):
    _, names = sd15_loras
    checked = sd15_engine.check_lora(LoraSpec(f"local:{names['kohya']}"))
    assert checked.components == ("unet", "text_encoder")
    assert checked.warnings == ()


def test_an_sdxl_lora_is_refused_by_the_sd15_engine(sd15_engine, sd15_loras):
    _, names = sd15_loras
    with pytest.raises(IncompatibleLoraError, match=r"sdxl family.*serves stable-diffusion-v1-5"):
        sd15_engine.check_lora(LoraSpec(f"local:{names['sdxl']}"))


def test_an_sd15_pivotal_lora_matches_diffusers_lora_plus_textual_inversion(
    loaded_sd15, base_settings, sd15_loras, tiny_sd15_dir, pristine_sd15, tmp_path
):
    """SD 1.5's advanced script writes `clip_l` alone: the tokens go into its one text encoder and come out exactly."""
    folder, names = sd15_loras
    pipe = loaded_sd15.pipe
    weight = pipe.text_encoder.get_input_embeddings().weight
    std = float(weight.detach().float().std()) * 3.0
    rows = make_embeddings([weight.shape[1]], 2, seed=61, std=std)
    assert set(rows) == {"clip_l"}
    (tmp_path / "piv.safetensors").write_bytes((folder / names["peft"]).read_bytes())
    save_file(rows, str(tmp_path / "piv_emb.safetensors"))
    settings = base_settings.replace(local_lora_dir=tmp_path)
    resolver = AdapterResolver(None, local_dir=tmp_path, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded_sd15, settings, resolver)
    tokenizer, size = pipe.tokenizer, len(pipe.tokenizer)
    prompt = "a photo of <s0><s1>, a cat"
    try:
        ours = pixels(generate(engine, request_for(prompt, LoraSpec("local:piv.safetensors"))).image)
    finally:
        engine.close()

    reference_pipe = StableDiffusionPipeline.from_pretrained(
        tiny_sd15_dir, safety_checker=None, requires_safety_checker=False
    )
    reference_pipe.set_progress_bar_config(disable=True)
    reference_pipe.load_lora_weights(str(tmp_path), weight_name="piv.safetensors")
    reference_pipe.fuse_lora()
    without = pixels(sd15_image(reference_pipe, prompt))
    reference_pipe.load_textual_inversion(
        rows["clip_l"],
        token=["<s0>", "<s1>"],
        text_encoder=reference_pipe.text_encoder,
        tokenizer=reference_pipe.tokenizer,
    )
    reference = pixels(sd15_image(reference_pipe, prompt))
    assert np.abs(reference - without).mean() > 1, "the tokens must visibly change the image"
    assert_images_close(ours, reference)
    assert np.abs(ours - reference).mean() < 0.1
    # Out exactly: the same tokenizer and embedding matrix, of the original size, every weight bit-exact.
    assert pipe.tokenizer is tokenizer and len(tokenizer) == size and "<s0>" not in tokenizer.get_vocab()
    assert pipe.text_encoder.get_input_embeddings().weight is weight and weight.shape[0] == size
    for name in ("unet", "text_encoder", "vae"):
        for key, value in getattr(pipe, name).state_dict().items():
            assert torch.equal(value, pristine_sd15[f"{name}.{key}"]), f"{name}.{key} drifted"


def request_for(prompt: str, *loras: LoraSpec) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=3, width=64, height=64, seed=7)


def sd15_image(pipe, prompt: str):
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(prompt=prompt, num_inference_steps=3, width=64, height=64, generator=generator).images[0]
