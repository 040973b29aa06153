"""Live previews and comparison cells at the engine: when previews come, what they are, what they leave alone."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import torch
from diffusers import AutoencoderTiny
from diffusers.image_processor import VaeImageProcessor
from PIL import Image

from engine.compare import CompareRequest
from engine.errors import SettingsError
from engine.families.sdxl import LATENT_RGB
from engine.pipeline.preview import LinearPreview, TinyVaePreview
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import Settings
from lora_catalog.entries import Family
from serving.backends import blocking
from serving.backends.local import LocalBackend
from tests.support.app_server import serve_routes
from tests.support.checks import assert_pristine, backend_of, generate


def request(*loras: LoraSpec, steps: int = 6, seed: int = 5) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=tuple(loras), steps=steps, width=64, height=64, seed=seed)


def run_with_previews(engine, generate: GenerateRequest) -> tuple[Image.Image, list[tuple[int, Image.Image]]]:
    frames: list[tuple[int, Image.Image]] = []
    with engine.prepare(generate) as prepared:
        result = engine.run(prepared, preview=lambda step, image: frames.append((step, image)))
    return result.image, frames


def test_previews_come_every_few_steps_and_leave_the_image_alone(make_engine, fixtures):
    engine = make_engine(preview_every=2)
    assert engine.status().preview == "linear (sdxl)"
    final, frames = run_with_previews(engine, request(LoraSpec(fixtures["peft"])))
    # Steps 2 and 4 of 6: never the last, whose image follows at once.
    assert [step for step, _ in frames] == [2, 4]
    # The linear preview works at latent resolution (the tiny VAE halves the side).
    assert all(image.size == (32, 32) for _, image in frames)
    assert frames[0][1].tobytes() != frames[1][1].tobytes()
    assert final.tobytes() == generate(engine, request(LoraSpec(fixtures["peft"]))).image.tobytes()


def test_previews_off_means_no_decoder_and_no_callback(make_engine):
    engine = make_engine(previews=False)
    assert engine.status().preview == "off"
    _, frames = run_with_previews(engine, request())
    assert frames == []


def test_a_local_autoencoder_tiny_decodes_previews_like_diffusers(make_engine, tmp_path):
    torch.manual_seed(0)
    vae = AutoencoderTiny(latent_channels=4)
    vae.save_pretrained(tmp_path / "taesd")
    engine = make_engine(preview_vae=str(tmp_path / "taesd"))
    assert engine.status().preview.startswith("AutoencoderTiny")
    _, frames = run_with_previews(engine, request(steps=4))
    assert [step for step, _ in frames] == [2]
    assert frames[0][1].size == (256, 256)  # TAESD upsamples 8x: the tiny pipeline's 32² latents -> 256²

    # With no scheduler scaling to undo, a preview is AutoencoderTiny.decode as diffusers post-processes it.
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = VaeImageProcessor().postprocess(vae.decode(latents).sample, output_type="pil")[0]
    assert TinyVaePreview(vae, "test")(latents, None).tobytes() == reference.tobytes()
    # Latents of another width (a Wan pool's 16 channels, under the same PREVIEW_VAE) get no preview, no error.
    assert TinyVaePreview(vae, "test")(torch.zeros(1, 16, 8, 8), None) is None


def test_an_absent_preview_vae_falls_back_to_the_linear_projection(make_engine):
    engine = make_engine(preview_vae="madebyollin/taesdxl")  # not in this test's empty HF cache
    assert engine.status().preview == "linear (sdxl)"


def test_the_linear_preview_is_comfyuis_projection_of_the_latent_channels():
    latents = torch.zeros(1, 4, 2, 2)
    latents[0, 0] = 1.0  # channel 0 alone: rgb = factors[0] + bias, mapped from [-1, 1] to 0..255
    image = LinearPreview(LATENT_RGB, Family.SDXL)(latents, None)
    expected = [
        round((w + b + 1) * 127.5) for w, b in zip((0.3651, 0.4232, 0.4341), (0.1084, -0.0175, -0.0011), strict=True)
    ]
    assert list(image.getpixel((0, 0))) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PREVIEWS": "sometimes"}, r"PREVIEWS='sometimes' is not accepted; accepted: 1, true"),
        ({"PREVIEW_VAE": "no such folder"}, r"PREVIEW_VAE='no such folder' is not accepted; accepted: auto, none"),
        ({"PREVIEW_EVERY": "0"}, r"PREVIEW_EVERY='0' is not accepted; accepted: an integer from 1 to 500"),
        ({"MAX_COMPARE_CELLS": "17"}, r"MAX_COMPARE_CELLS='17' is not accepted; accepted: an integer from 1 to 16"),
    ],
)
def test_preview_and_compare_settings_are_parsed_strictly(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)
    defaults = Settings.from_env({})
    assert (defaults.previews, defaults.preview_vae, defaults.preview_every) == (True, "auto", 2)
    assert Settings.from_env({"PREVIEWS": "0"}).previews is False


def test_compare_runs_every_cell_in_one_turn_and_each_equals_its_own_run(make_engine, fixtures, pristine, loaded):
    engine = make_engine()
    peft = LoraSpec(fixtures["peft"])
    compared = blocking(
        backend_of(engine).compare(
            CompareRequest(prompt="a fox", loras=(peft,), scales=(0.0, 1.0), include_base=True, steps=2, seed=9)
        )
    )
    assert compared.labels == ("base", "peft (0)", "peft (1)")
    alone = [
        generate(engine, request(steps=2, seed=9)),
        generate(engine, request(LoraSpec(peft.ref, 0.0), steps=2, seed=9)),
        generate(engine, request(LoraSpec(peft.ref, 1.0), steps=2, seed=9)),
    ]
    assert [r.image.tobytes() for r in compared.results] == [r.image.tobytes() for r in alone]
    engine.close()
    assert_pristine(loaded, pristine)


def test_post_slash_asks_for_no_previews(make_engine):
    asked: list[object] = []

    class Recording(LocalBackend):
        async def generate(self, request, **kwargs):
            # Where POST / hands its request over to be queued and run.
            asked.append(kwargs.get("preview"))
            return await super().generate(request, **kwargs)

    with serve_routes(Recording.of(make_engine())) as url:
        answer = httpx.post(url, json={"inputs": "a fox", "parameters": {"num_inference_steps": 4}}, timeout=120)
    assert answer.status_code == 200
    assert asked == [None]


@pytest.mark.parametrize("base", ["stable-diffusion-v1-5/stable-diffusion-v1-5", "stabilityai/stable-diffusion-2-1"])
def test_sd15_and_sd2_pools_preview_in_sd15s_latent_space(loaded_sd15, base_settings, base):
    from engine.families.registry import family_spec
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver

    # SD 2.x shares SD 1.5's VAE: its pool previews with the same projection (ComfyUI's SD20 uses SD15's format).
    loaded = dataclasses.replace(loaded_sd15, base_model_id=base, family=family_spec(base))
    settings = base_settings.replace(preview_every=2, base_model_id=base)
    engine = Engine(loaded, settings, AdapterResolver(None, local_dir=None, token=None, max_bytes=2**20))
    try:
        family = "sd15" if "v1-5" in base else "sd2"
        assert engine.status().preview == f"linear ({family})"
        _, frames = run_with_previews(engine, request())
        assert [step for step, _ in frames] == [2, 4]
        assert frames[0][1].tobytes() != frames[1][1].tobytes()
    finally:
        engine.close()
