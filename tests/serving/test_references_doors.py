"""Further reference images through every door: `parameters.images` on `POST /` (base64 or data URLs, a JSON body
only; `InferenceClient.image_to_image(..., extra_body={"images": [...]})`), `images` on the Gradio API (a list of
`handle_file`s after `strength`, defaulting to none), the cluster's wire (the order kept) and the recipe (how many,
each one's short SHA-256, in order). On the shared app's tiny SDXL pool, which takes one image: references are a
400 naming its limit, and nothing is lost. The pools that take several: tests/engine/families/test_references_*.py
and test_qwen_image_edit_plus.py."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import httpx
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from huggingface_hub import InferenceClient

from engine.images import EncodedImage, InputImage
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, Timings
from serving.cluster.wire import request_from_json, request_to_json
from serving.http.body import parse_body
from serving.recipes import image_hash, parse_recipe, recipe_text
from tests.support.image_inputs import example_image, input_image, png_bytes

PROMPT = "a fox in a forest"
FIRST, SECOND, THIRD = (png_bytes(example_image(64, 64, seed)) for seed in (0, 1, 2))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decoded(image: object) -> InputImage:
    assert isinstance(image, EncodedImage), image
    return image.decoded(10**6)


def test_parameters_images_are_decoded_in_order_as_base64_or_data_urls():
    body = {
        "inputs": b64(FIRST),
        "parameters": {"prompt": PROMPT, "images": [b64(SECOND), "data:image/png;base64," + b64(THIRD)]},
    }
    request = parse_body(json.dumps(body).encode(), lora=None, accept=None).request
    # Carried as the client's files (the engine's check decodes them once counted), in order.
    assert [image.data for image in (request.image, *request.images)] == [FIRST, SECOND, THIRD]
    assert decoded(request.image) == input_image(seed=0)
    assert tuple(map(decoded, request.images)) == (input_image(seed=1), input_image(seed=2))
    # A raw image body stays one image.
    raw = parse_body(FIRST, lora=None, accept=None, content_type="image/png").request
    assert decoded(raw.image) == input_image(seed=0) and raw.images == ()


def test_a_reference_that_is_not_an_image_or_over_the_pixel_limit_is_refused_naming_it():
    body = {"inputs": b64(FIRST), "parameters": {"prompt": PROMPT, "images": [b64(SECOND), b64(b"not a png")]}}
    with pytest.raises(Exception, match=r"parameters\.images\[1\] is not an image") as e:
        parse_body(json.dumps(body).encode(), lora=None, accept=None)
    assert e.value.status == 400  # type: ignore[attr-defined]
    big = png_bytes(example_image(128, 128, 3))
    body["parameters"]["images"] = [b64(big)]  # type: ignore[index]
    with pytest.raises(Exception, match=r"parameters\.images\[0\] is 128x128") as e:
        parse_body(json.dumps(body).encode(), lora=None, accept=None, max_pixels=64 * 64)
    assert e.value.status == 400  # type: ignore[attr-defined]


def test_the_wire_carries_the_references_in_order():
    request = GenerateRequest(prompt=PROMPT, image=input_image(), images=(input_image(seed=2), input_image(seed=1)))
    back = request_from_json(json.loads(json.dumps(request_to_json(request))))
    assert tuple(map(decoded, back.images)) == request.images
    assert request_from_json(request_to_json(GenerateRequest(prompt=PROMPT))).images == ()


def test_the_recipe_records_how_many_references_ran_and_each_ones_short_sha256_in_order():
    first, second = input_image(seed=0), input_image(seed=1)
    checked = CheckedRequest(prompt=PROMPT, steps=4, guidance=1.0, width=64, height=64, seed=3, image=first)
    single = GenerateResult(example_image(), 3, checked, Timings())
    assert "Reference" not in recipe_text(single)  # one image: the recipe as before
    for order in ((first, second), (second, first)):
        ran = replace(checked, image=order[0], images=order[1:])
        recipe = parse_recipe(recipe_text(GenerateResult(example_image(), 3, ran, Timings())))
        assert recipe.parameters["Reference images"] == "2"
        expected = f"image 1: {image_hash(order[0])}, image 2: {image_hash(order[1])}"
        assert recipe.parameters["Reference hashes"] == expected and len(image_hash(first)) == 12
    assert image_hash(first) != image_hash(second)


# -- through the shared app (its tiny SDXL pool takes one image) ---------------------------------------------------


def test_inference_clients_extra_body_images_reach_the_pool_which_refuses_naming_its_limit(server):
    applied = server.engine.status().applied  # type: ignore[union-attr]
    client = InferenceClient(model=server.url, timeout=120)
    with pytest.raises(Exception, match="this pool's model takes one image") as e:
        client.image_to_image(FIRST, prompt=PROMPT, num_inference_steps=2, extra_body={"images": [b64(SECOND)]})
    assert getattr(getattr(e.value, "response", None), "status_code", 400) == 400
    assert server.engine.status().applied == applied  # type: ignore[union-attr]


def test_images_without_the_first_image_are_a_400(server):
    body = {"inputs": PROMPT, "parameters": {"num_inference_steps": 2, "images": [b64(SECOND)]}}
    response = httpx.post(server.url, content=json.dumps(body).encode(), timeout=120)
    assert response.status_code == 400 and "without the first image" in response.json()["error"]


def test_the_gradio_api_takes_images_after_strength_and_the_pool_status_says_the_limit(client, tmp_path):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name in ("/generate", "/generate_images", "/compare"):
        parameters = {p["parameter_name"]: p for p in endpoints[name]["parameters"]}
        # `images` after `strength`; only the LoRA windows (added after it) follow.
        assert list(parameters)[-8:-4] == ["image", "mask", "strength", "images"], name
        assert parameters["images"]["parameter_default"] is None, name
    pools = client.predict(api_name="/pool_status")["pools"]
    assert [p["defaults"]["max_reference_images"] for p in pools] == [1]
    first, second = tmp_path / "first.png", tmp_path / "second.png"
    first.write_bytes(FIRST)
    second.write_bytes(SECOND)
    with pytest.raises(AppError, match="this pool's model takes one image"):
        client.predict(
            prompt=PROMPT,
            steps=2,
            image=handle_file(str(first)),
            images=[handle_file(str(second))],
            api_name="/generate",
        )


def test_inference_clients_extra_body_arriving_as_a_parameter_is_read_as_parameters():
    """huggingface_hub 2.4 sends `image_to_image`'s keyword arguments as parameters, `extra_body` among them."""
    body = {"inputs": b64(FIRST), "parameters": {"prompt": PROMPT, "extra_body": {"images": [b64(SECOND)]}}}
    request = parse_body(json.dumps(body).encode(), lora=None, accept=None).request
    assert tuple(map(decoded, request.images)) == (input_image(seed=1),) and request.prompt == PROMPT
    body["parameters"]["images"] = [b64(THIRD)]  # type: ignore[index]
    with pytest.raises(Exception, match="images given both in parameters and in extra_body"):
        parse_body(json.dumps(body).encode(), lora=None, accept=None)
