"""`parameters.loras` on `POST /`: the shape huggingface_hub's InferenceClient sends, against the launched app."""

from __future__ import annotations

import io
import json
import re

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from PIL import Image

from engine.errors import InvalidRequestError
from serving.http.api import lora_from_path, parse_body
from tests.support.app_server import AppServer
from tests.support.clients import api_client
from tests.support.loras import WEIGHTS

TIMEOUT = httpx.Timeout(120.0)
SIZE = {"num_inference_steps": 2, "guidance_scale": 5.0, "width": 64, "height": 64, "seed": 9}
# /generate's arguments for the same request as SIZE's.
CLIENT_ARGS = {
    "prompt": "a fox in a forest",
    "negative_prompt": "",
    "lora": "",
    "lora_scale": 1.0,
    "lora_2": "",
    "lora_2_scale": 1.0,
    "steps": 2,
    "guidance": 5.0,
    "width": 64,
    "height": 64,
    "seed": 9,
}


@pytest.fixture(scope="module")
def inference(server: AppServer) -> InferenceClient:
    return InferenceClient(base_url=server.url, timeout=120)


def text_to_image(client: InferenceClient, loras: list[dict]) -> Image.Image:
    image = client.text_to_image("a fox in a forest", **SIZE, extra_body={"loras": loras})
    return image.convert("RGB")


def post(server: AppServer, parameters: dict, **headers: str) -> httpx.Response:
    body = json.dumps({"inputs": "a fox in a forest", "parameters": {**SIZE, **parameters}})
    return httpx.post(server.url, content=body, headers={"accept": "image/png", **headers}, timeout=TIMEOUT)


def png(response: httpx.Response) -> Image.Image:
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"] == "image/png"
    return Image.open(io.BytesIO(response.content)).convert("RGB")


def hub_url(repo: str, file: str = WEIGHTS, revision: str = "main") -> str:
    return f"https://huggingface.co/{repo}/resolve/{revision}/{file}"


def test_inference_client_loras_match_the_lora_header(server, inference, fixtures):
    peft = fixtures["peft"]
    by_header = png(post(server, {"lora_scale": 0.7}, lora=peft))
    by_repo_id = text_to_image(inference, [{"path": peft, "scale": 0.7}])
    by_file_url = text_to_image(inference, [{"path": hub_url(peft), "scale": 0.7}])
    plain = text_to_image(inference, [])
    assert by_repo_id.size == (64, 64)
    assert by_repo_id.tobytes() == by_header.tobytes()
    assert by_file_url.tobytes() == by_header.tobytes()
    assert plain.tobytes() != by_header.tobytes()


def test_two_loras_with_their_scales_match_the_named_api(server, inference, fixtures):
    kohya, second = fixtures["kohya"], fixtures["second"]
    listed = text_to_image(
        inference, [{"path": hub_url(kohya, "ohwx_style.safetensors"), "scale": 0.5}, {"path": second, "scale": -0.8}]
    )
    path, _ = api_client(server.url, verbose=False).predict(
        prompt="a fox in a forest",
        negative_prompt="",
        lora=kohya,
        lora_scale=0.5,
        lora_2=second,
        lora_2_scale=-0.8,
        steps=2,
        guidance=5.0,
        width=64,
        height=64,
        seed=9,
        api_name="/generate",
    )
    with Image.open(path) as image:
        assert listed.tobytes() == image.convert("RGB").tobytes()


def test_the_header_and_the_list_combine_header_first(server, fixtures):
    both = png(
        post(server, {"lora_scale": 0.5, "loras": [{"path": fixtures["second"], "scale": 1.0}]}, lora=fixtures["peft"])
    )
    response = post(server, {"loras": [{"path": fixtures["peft"], "scale": 0.5}, {"path": fixtures["second"]}]})
    assert both.tobytes() == png(response).tobytes()
    assert response.headers["x-lora-cache"] == f"{fixtures['peft']}=hit,{fixtures['second']}=hit"


def test_a_url_on_another_host_is_a_400_and_fetches_nothing(server, inference, clean_hub):
    with pytest.raises(HfHubHTTPError) as raised:
        text_to_image(inference, [{"path": "https://example.com/owner/name/resolve/main/x.safetensors"}])
    assert raised.value.response.status_code == 400
    error = raised.value.response.json()
    assert error["error_type"] == "InvalidRequestError"
    assert "only https://huggingface.co URLs are read, not https://example.com" in error["error"]
    assert clean_hub.requests == []


def test_more_loras_than_the_limit_is_a_400_naming_it(server, base_settings, fixtures):
    loras = [{"path": f"fixtures/lora-{i}"} for i in range(base_settings.max_loras + 1)]
    response = post(server, {"loras": loras})
    assert response.status_code == 400
    assert f"accepted: at most {base_settings.max_loras} per request" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("owner/name", ("owner/name", None, None)),
        (" owner/name ", ("owner/name", None, None)),
        (hub_url("owner/name"), ("owner/name", "main", WEIGHTS)),
        (hub_url("owner/name", "sub/dir/x.safetensors", "v1.0"), ("owner/name", "v1.0", "sub/dir/x.safetensors")),
        (hub_url("owner/name", revision="refs%2Fpr%2F3"), ("owner/name", "refs/pr/3", WEIGHTS)),
        ("https://HuggingFace.co/owner/name/resolve/main/x.safetensors", ("owner/name", "main", "x.safetensors")),
        # A Wan 2.2 pair: its folder's page (the folder with a trailing '/'), or its two files joined with '+'.
        ("https://huggingface.co/o/n/tree/main/Seko-V1.1/", ("o/n", "main", "Seko-V1.1/")),
        ("https://huggingface.co/o/n/tree/main/a/Seko-V1.1", ("o/n", "main", "a/Seko-V1.1/")),
        (
            "https://huggingface.co/o/n/resolve/main/h.safetensors+l.safetensors",
            ("o/n", "main", "h.safetensors+l.safetensors"),
        ),
    ],
)
def test_lora_paths_parse_into_repo_revision_and_file(path, expected):
    assert lora_from_path(path) == expected


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("http://huggingface.co/o/n/resolve/main/x.safetensors", "not http://huggingface.co"),
        ("https://hf.co/o/n/resolve/main/x.safetensors", "not https://hf.co"),
        ("https://huggingface.co.evil.example/o/n/resolve/main/x.safetensors", "not https://huggingface.co.evil"),
        ("https://user@huggingface.co/o/n/resolve/main/x.safetensors", "not https://user@huggingface.co"),
        ("https://huggingface.co:8443/o/n/resolve/main/x.safetensors", "not https://huggingface.co:8443"),
        ("https://huggingface.co/o/n/blob/main/x.safetensors", "not a file URL of a model repo"),
        ("https://huggingface.co/datasets/o/n/resolve/main/x.safetensors", "not a file URL of a model repo"),
        ("https://huggingface.co/o/n/resolve/main/", "not a file URL of a model repo"),
        ("https://huggingface.co/o/n", "not a file URL of a model repo"),
        ("https://huggingface.co/o/n/resolve/main/x.safetensors?download=true", "query or a fragment"),
        ("file:///etc/passwd", "not file://"),
    ],
)
def test_other_urls_are_refused_naming_the_accepted_forms(path, match):
    with pytest.raises(InvalidRequestError, match=match) as raised:
        lora_from_path(path)
    assert "accepted: a Hub repo id 'owner/name' or a Hub file URL 'https://huggingface.co/" in str(raised.value)


@pytest.mark.parametrize(
    ("loras", "match"),
    [
        ('"owner/name"', r"parameters.loras must be a list"),
        ('["owner/name"]', r"parameters.loras\[0\] must be an object"),
        ('[{"repo": "owner/name"}]', r"parameters.loras\[0\] has unknown key\(s\) repo; accepted: path, scale"),
        ('[{"scale": 1}]', r"parameters.loras\[0\].path must be a Hub repo id"),
        ('[{"path": "owner/name", "scale": "high"}]', r"parameters.loras\[0\].scale must be a number, got string"),
        ('[{"path": "owner/name", "scale": true}]', r"parameters.loras\[0\].scale must be a number, got boolean"),
    ],
)
def test_malformed_lists_are_refused_by_position(loras, match):
    body = f'{{"inputs": "a fox", "parameters": {{"loras": {loras}}}}}'.encode()
    with pytest.raises(InvalidRequestError, match=match):
        parse_body(body, lora=None, accept=None)


def test_parse_body_puts_the_header_first_and_keeps_each_scale():
    body = json.dumps(
        {"inputs": "a fox", "parameters": {"lora_scale": 0.3, "loras": [{"path": hub_url("o/b"), "scale": 2}]}}
    )
    loras = parse_body(body.encode(), lora="o/a", accept=None).request.loras
    assert [(s.ref, s.scale, s.revision, s.weight_name) for s in loras] == [
        ("o/a", 0.3, None, None),
        ("o/b", 2.0, "main", WEIGHTS),
    ]


def test_lora_scale_without_the_header_is_refused_even_with_a_list():
    body = json.dumps({"inputs": "a fox", "parameters": {"lora_scale": 0.3, "loras": [{"path": "o/b"}]}})
    with pytest.raises(InvalidRequestError, match=r"entries of parameters\.loras carry their own scale"):
        parse_body(body.encode(), lora=None, accept=None)


# -- the sampler and CLIP skip, per request ---------------------------------------------------------


def test_inference_client_scheduler_is_the_named_apis_sampler(server, inference):
    """huggingface_hub's `text_to_image(..., scheduler=...)`: the same image as /generate with that sampler."""
    by_class = inference.text_to_image("a fox in a forest", **SIZE, scheduler="EulerAncestralDiscreteScheduler")
    by_name = png(post(server, {"scheduler": "Euler a"}))
    path, info = api_client(server.url, verbose=False).predict(
        **{**CLIENT_ARGS, "scheduler": "EulerAncestralDiscreteScheduler"}, api_name="/generate"
    )
    with Image.open(path) as image:
        assert by_class.convert("RGB").tobytes() == image.convert("RGB").tobytes() == by_name.tobytes()
    assert (info["scheduler"], info["sampler"]) == ("EulerAncestralDiscreteScheduler", "Euler a")
    plain = png(post(server, {}))
    assert plain.tobytes() != by_name.tobytes()


def test_scheduler_options_and_clip_skip_travel_in_parameters(server):
    karras = png(
        post(server, {"scheduler": "DPMSolverMultistepScheduler", "scheduler_options": {"use_karras_sigmas": True}})
    )
    assert karras.tobytes() == png(post(server, {"scheduler": "DPM++ 2M Karras"})).tobytes()
    skipped = png(post(server, {"clip_skip": 1}))
    assert skipped.tobytes() != png(post(server, {})).tobytes()


@pytest.mark.parametrize(
    ("parameters", "match"),
    [
        ({"scheduler": "Restart"}, r"scheduler 'Restart' is not offered here; accepted: a sampler \(Euler, Euler a, "),
        ({"scheduler": "DDIM", "scheduler_options": {"use_karras_sigmas": True}}, r"DDIMScheduler has no option"),
        ({"scheduler_options": {"timestep_spacing": 1}}, r"timestep_spacing must be a boolean or a string"),
        ({"clip_skip": 9}, r"clip_skip=9 is out of range; accepted: an integer from 0 to 1"),
        ({"num_images": 2}, r"unknown parameter\(s\) num_images; accepted: .*scheduler, scheduler_options, clip_skip"),
    ],
)
def test_bad_samplers_are_a_400_listing_what_is_accepted(server, parameters, match):
    response = post(server, parameters)
    assert response.status_code == 400, response.text[:300]
    # Over a range's top is the engine's LimitExceededError, an InvalidRequestError too.
    assert response.json()["error_type"] in ("InvalidRequestError", "LimitExceededError")
    assert re.search(match, response.json()["error"]), response.json()["error"]


def test_every_answer_carries_its_recipe_png_chunk_or_jpeg_exif(server, fixtures):
    from serving.recipes import parse_recipe, read_recipe

    as_png = post(server, {"scheduler": "Euler a", "loras": [{"path": fixtures["peft"], "scale": 0.5}]})
    with Image.open(io.BytesIO(as_png.content)) as opened:
        recipe = parse_recipe(read_recipe(opened) or "")
    assert str(recipe.request.seed) == as_png.headers["x-seed"] == "9"
    assert (recipe.request.scheduler, recipe.request.loras[0].ref, recipe.request.loras[0].scale) == (
        "Euler a",
        fixtures["peft"],
        0.5,
    )
    as_jpeg = post(server, {}, accept="image/jpeg")
    assert as_jpeg.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(as_jpeg.content)) as opened:
        text = read_recipe(opened) or ""
    assert text.startswith("a fox in a forest\nSteps: 2, Sampler: Euler, CFG scale: 5, Seed: 9, Size: 64x64")
