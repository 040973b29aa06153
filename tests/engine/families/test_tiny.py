"""The offline test bed's pipeline is a real SDXL pipeline, saved and loaded like any other."""

from __future__ import annotations

import json

import torch
from diffusers import StableDiffusionXLPipeline

from engine.families.sdxl import build_tiny_pipeline
from engine.families.tiny import ensure_tiny_pipeline


def test_saved_folder_loads_with_from_pretrained_and_keeps_its_tokenizers(tiny_dir):
    pipe = StableDiffusionXLPipeline.from_pretrained(tiny_dir)
    index = json.loads((tiny_dir / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline"
    assert pipe.unet.config.addition_embed_type == "text_time"
    assert any(name.endswith("attn2.to_k") for name, _ in pipe.unet.named_modules())
    assert type(pipe.text_encoder).__name__ == "CLIPTextModel"
    assert type(pipe.text_encoder_2).__name__ == "CLIPTextModelWithProjection"
    assert pipe.tokenizer.model_max_length == pipe.tokenizer_2.model_max_length == 77
    assert pipe.tokenizer_2.pad_token == "!"
    assert pipe.tokenizer("a photo of a cat").input_ids[1:3] != [pipe.tokenizer.unk_token_id] * 2


def test_same_seed_same_weights_other_seed_other_weights():
    first, again, other = build_tiny_pipeline(0), build_tiny_pipeline(0), build_tiny_pipeline(1)
    assert torch.equal(first.unet.conv_in.weight, again.unet.conv_in.weight)
    assert not torch.equal(first.unet.conv_in.weight, other.unet.conv_in.weight)


def test_ensure_is_idempotent(tmp_path):
    folder = ensure_tiny_pipeline(tmp_path / "p")
    stamp = (folder / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    ensure_tiny_pipeline(tmp_path / "p")
    assert (folder / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == stamp


def test_a_small_image_is_fast_enough_to_test_with(loaded):
    image = loaded.pipe("a cat", num_inference_steps=2, generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (64, 64)
    assert sum(p.numel() for p in loaded.pipe.unet.parameters()) < 3_000_000
