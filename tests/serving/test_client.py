"""The launched app through `gradio_client` (its named API) and plain HTTP on the same port."""

from __future__ import annotations

import re

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from serving.ui.video_api import video_parameters
from tests.support.images import assert_images_close
from tests.support.reliability_app import CLIENT_GENERATE

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"


def generate(client: Client, **overrides: object) -> tuple[Image.Image, dict]:
    path, info = client.predict(**(CLIENT_GENERATE | overrides), api_name="/generate")
    with Image.open(path) as image:
        return image.convert("RGB"), info


def test_only_the_named_endpoints_are_public(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert set(endpoints) == {
        "/generate",
        "/generate_images",
        "/generate_video",
        "/compare",
        "/catalog",
        "/lora_info",
        "/pool_status",
    }
    # The video endpoint's are the request's declared video fields (serving.ui.video_api).
    assert [p["parameter_name"] for p in endpoints["/generate_video"]["parameters"]] == video_parameters()
    names = [p["parameter_name"] for p in endpoints["/generate"]["parameters"]]
    images = [p["parameter_name"] for p in endpoints["/generate_images"]["parameters"]]
    starting = ["image", "mask", "strength", "images"]
    window = ["lora_start", "lora_end", "lora_2_start", "lora_2_end"]
    # /generate_images takes num_images after /generate's text-to-image arguments, before the image's; each LoRA's
    # schedule window comes last on every generation endpoint (added later: no positional argument moved).
    assert images == [*names[:-8], "num_images", *names[-8:]]
    assert names[-4:] == video_parameters()[-7:-3] == window
    # The video endpoint's own last arguments, after those (an IC-LoRA's reference video, then the in-context call's
    # settings): none moved.
    assert video_parameters()[-3:] == ["video", "reference_strength", "reference_downscale"]
    assert names == [
        "prompt",
        "negative_prompt",
        "lora",
        "lora_scale",
        "lora_2",
        "lora_2_scale",
        "steps",
        "guidance",
        "width",
        "height",
        "seed",
        "base",
        "scheduler",
        "scheduler_options",
        "clip_skip",
        "image",
        "mask",
        "strength",
        "images",
        *window,
    ]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in endpoints["/generate"]["parameters"]}
    # No window: the LoRA at its scale on every step, as before.
    assert [defaults[name] for name in window] == [None] * 4
    # What /generate did before these existed: the model's own scheduler, no CLIP skip.
    assert (defaults["scheduler"], defaults["scheduler_options"], defaults["clip_skip"]) == ("", None, 0)
    # ... and text-to-image, with no image.
    assert [defaults[name] for name in starting] == [None, None, None, None]
    compare = [p["parameter_name"] for p in endpoints["/compare"]["parameters"]]
    assert compare == [
        "prompt",
        "negative_prompt",
        "loras",
        "scales",
        "include_base",
        "steps",
        "guidance",
        "width",
        "height",
        "seed",
        "base",
        "scheduler",
        "clip_skip",
        "image",
        "mask",
        "strength",
        "images",
        # Each LoRA's window, listed as `scales` (added after `images`: no positional argument moved).
        "starts",
        "ends",
    ]
    compare_defaults = {p["parameter_name"]: p["parameter_default"] for p in endpoints["/compare"]["parameters"]}
    assert (compare_defaults["starts"], compare_defaults["ends"]) == ("", "")


def test_catalog_pages_local_and_hub_loras_with_freshness(client, fixtures):
    page = client.predict(base="", search="", sort="downloads", page=0, api_name="/catalog")
    refs = [e["ref"] for e in page["entries"]]
    assert refs[:2] == [fixtures.local["kohya"], fixtures.local["peft"]]
    assert refs[2] == fixtures["peft"]
    assert page["freshness"]["source"] == "hub"
    assert page["freshness"]["offline"] is False
    assert (page["page"], page["page_size"]) == (0, 24)
    # The fixture repos (LyCORIS and unsupported variants among them) fill more than one page.
    assert page["has_more"] is (page["total_known"] > 24)
    last = page["total_known"] // 24  # the last page holding entries; the one after it is past the end
    beyond = client.predict(base="", search="", sort="downloads", page=last + 1, api_name="/catalog")
    assert (beyond["entries"], beyond["has_more"], beyond["total_known"]) == ([], False, page["total_known"])
    peft = page["entries"][2]
    assert peft["trigger_words"] == ["sks style"]
    assert peft["preview_urls"][0].endswith("images/preview.png")
    by_likes = client.predict(base=SDXL, search="", sort="likes", page=0, api_name="/catalog")
    assert next(e["ref"] for e in by_likes["entries"] if e["source"] == "hub") == fixtures["kohya"]
    found = client.predict(base="", search="kohya", sort="downloads", page=0, api_name="/catalog")
    assert [e["ref"] for e in found["entries"]] == [fixtures.local["kohya"], fixtures["kohya"]]


def test_catalog_refuses_a_bad_sort_with_its_message(client):
    with pytest.raises(AppError, match="sort 'best' is not accepted; accepted: downloads, likes"):
        client.predict(base="", search="", sort="best", page=0, api_name="/catalog")


def test_generate_applies_loras_and_reproduces_with_the_same_seed(client, fixtures):
    base, base_info = generate(client)
    styled, info = generate(client, lora=fixtures["peft"])
    again, again_info = generate(client, lora=fixtures["peft"])
    half, _ = generate(client, lora=fixtures["peft"], lora_scale=0.5)
    blend, blend_info = generate(client, lora=fixtures["peft"], lora_2=fixtures["second"], lora_2_scale=0.8)
    assert base.tobytes() != styled.tobytes()
    assert styled.tobytes() == again.tobytes()
    assert half.tobytes() not in (styled.tobytes(), base.tobytes())
    assert blend.tobytes() != styled.tobytes()
    assert base_info["seed"] == info["seed"] == 21
    assert base_info["loras"] == []
    assert info["loras"][0]["ref"] == fixtures["peft"]
    assert again_info["loras"][0]["cache"] == "hit"
    assert [(a["ref"], a["scale"]) for a in blend_info["loras"]] == [(fixtures["peft"], 1.0), (fixtures["second"], 0.8)]
    assert set(info["timings"]) == {"resolve", "prepare", "apply", "inference", "total"}


def test_seed_minus_one_is_random_and_reported(client):
    _, info = generate(client, seed=-1)
    assert 0 <= info["seed"] < 2**32
    assert info["steps"] == 2


def test_lora_info_resolves_and_checks_a_lora(client, fixtures):
    info = client.predict(repo_id=fixtures["kohya"], revision="", weight_name="", api_name="/lora_info")
    assert info["entry"]["trigger_words"] == ["ohwx"]
    assert info["entry"]["non_commercial"] is True
    assert info["entry"]["weight_name"] == "ohwx_style.safetensors"
    assert info["check"]["rank"] == 4
    assert info["check"]["layers"] > 0
    assert "unet" in info["check"]["components"]
    local = client.predict(repo_id=fixtures.local["peft"], revision="", weight_name="", api_name="/lora_info")
    assert local["entry"]["source"] == "local"


def test_an_incompatible_lora_is_refused_with_its_message(client, fixtures):
    expected = re.escape(f"LoRA '{fixtures['sd15']}' was made for stable-diffusion-v1-5/stable-diffusion-v1-5")
    with pytest.raises(AppError, match=expected):
        generate(client, lora=fixtures["sd15"])
    with pytest.raises(AppError, match="accepted: LoRAs for the sdxl family"):
        client.predict(repo_id=fixtures["sd15"], revision="", weight_name="", api_name="/lora_info")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps": 2.5}, r"steps=2\.5 is not an integer"),
        ({"seed": 1.5}, r"seed=1\.5 is not an integer"),
        ({"lora": "fixtures/peft", "lora_scale": None}, r"lora_scale is empty"),
    ],
)
def test_wrong_types_are_refused_by_name_not_rounded(client, overrides, message):
    with pytest.raises(AppError, match=message):
        generate(client, **overrides)


def test_an_unknown_lora_and_a_bad_size_are_refused(client):
    with pytest.raises(AppError, match="fixtures/nothing-here"):
        client.predict(repo_id="fixtures/nothing-here", revision="", weight_name="", api_name="/lora_info")
    with pytest.raises(AppError, match="width=100 is not a multiple of 8"):
        generate(client, width=100)


def test_the_same_port_serves_the_ui_and_the_inference_api(server, fixtures):
    page = httpx.get(server.url, timeout=30)
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    image = httpx.post(
        server.url,
        content='{"inputs": "a fox", "parameters": {"num_inference_steps": 2}}',
        headers={"lora": fixtures["peft"]},
        timeout=120,
    )
    assert image.status_code == 200
    assert image.headers["content-type"] == "image/jpeg"
    refused = httpx.post(server.url, content="{", timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error_type"] == "InvalidRequestError"


def test_the_base_parameter_and_the_pool_status(client):
    plain, _ = generate(client)
    named, _ = generate(client, base=SDXL)
    assert named.tobytes() == plain.tobytes()
    with pytest.raises(AppError, match=r"'black-forest-labs/FLUX.1-dev' is not served here; served: stabilityai/"):
        generate(client, base="black-forest-labs/FLUX.1-dev")
    status = client.predict(api_name="/pool_status")
    assert [(p["base_model_id"], p["family"], p["default"], p["resident"]) for p in status["pools"]] == [
        (SDXL, "sdxl", True, True)
    ]
    # Which inputs the pool reads: SDXL's guidance is classifier-free, with the negative prompt.
    (defaults,) = (p["defaults"] for p in status["pools"])
    assert (defaults["guidance_kind"], defaults["negative_prompt"], defaults["side_multiple"]) == ("cfg", True, 8)


def test_generate_takes_a_sampler_and_clip_skip_and_says_what_ran(client):
    plain, plain_info = generate(client)
    euler_a, info = generate(client, scheduler="Euler a")
    karras, karras_info = generate(
        client, scheduler="DPMSolverMultistepScheduler", scheduler_options={"use_karras_sigmas": True}
    )
    skipped, skipped_info = generate(client, clip_skip=1)
    assert (plain_info["sampler"], plain_info["scheduler"], plain_info["clip_skip"]) == ("Euler", None, 0)
    assert (info["sampler"], karras_info["sampler"], skipped_info["clip_skip"]) == ("Euler a", "DPM++ 2M Karras", 1)
    assert len({plain.tobytes(), euler_a.tobytes(), karras.tobytes(), skipped.tobytes()}) == 4
    with pytest.raises(AppError, match=r"scheduler 'Restart' is not offered here; accepted: a sampler \(Euler"):
        generate(client, scheduler="Restart")


def test_generate_images_answers_a_list_each_image_its_seed_alone(client):
    cells, info = client.predict(**(CLIENT_GENERATE | {"num_images": 3}), api_name="/generate_images")
    assert [cell["caption"] for cell in cells] == ["seed 21", "seed 22", "seed 23"]
    assert info["seeds"] == [21, 22, 23]
    for cell, seed in zip(cells, info["seeds"], strict=True):
        with Image.open(cell["image"]) as batch:
            alone, _ = generate(client, seed=seed)
            assert_images_close(batch, alone, seed)
    with pytest.raises(AppError, match=r"num_images=5 is out of range; accepted: an integer from 1 to 4"):
        client.predict(**(CLIENT_GENERATE | {"num_images": 5}), api_name="/generate_images")


def test_the_clients_images_carry_their_recipe(client):
    from serving.recipes import parse_recipe

    path, info = client.predict(**(CLIENT_GENERATE | {"scheduler": "DDIM"}), api_name="/generate")
    with Image.open(path) as image:
        recipe = parse_recipe(image.info["parameters"])
    assert (recipe.request.seed, recipe.request.scheduler) == (info["seed"], "DDIM")
    cells, _ = client.predict(**(CLIENT_GENERATE | {"num_images": 2}), api_name="/generate_images")
    seeds = []
    for cell in cells:
        with Image.open(cell["image"]) as image:
            seeds.append(parse_recipe(image.info["parameters"]).request.seed)
    assert seeds == [21, 22]
