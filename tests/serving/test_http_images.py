"""Image-to-image on `POST /`: Hugging Face's task as huggingface_hub's InferenceClient sends it, a raw image body,
a data URL, and every bad input refused with a JSON error naming it, against the launched app."""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from huggingface_hub import InferenceClient
from PIL import Image

from engine.images import InputImage
from engine.requests import GenerateRequest, LoraSpec
from serving.http.images import is_image_text
from tests.support.app_server import AppServer
from tests.support.checks import generate
from tests.support.image_inputs import example_image, example_mask, png_bytes

TIMEOUT = httpx.Timeout(120.0)
PROMPT = "a fox in a forest"
IMAGE = png_bytes(example_image())
STEPS = {"num_inference_steps": 4, "guidance_scale": 5.0, "seed": 9}


def post(server: AppServer, body: object, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url, content=content, headers={"accept": "image/png", **headers}, timeout=TIMEOUT)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image_body(parameters: dict, image: bytes = IMAGE) -> dict:
    return {"inputs": b64(image), "parameters": {"prompt": PROMPT, **STEPS, **parameters}}


def rgb(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text[:500]
    return Image.open(io.BytesIO(response.content)).convert("RGB").tobytes()


def engine_image(server: AppServer, lora: str | None = None, **fields: object) -> bytes:
    """What the app's engine makes for the same image-to-image request, called directly."""
    request = GenerateRequest(
        prompt=PROMPT,
        loras=(LoraSpec(lora),) if lora else (),
        steps=4,
        guidance=5.0,
        seed=9,
        image=InputImage.from_pil(example_image()),
        **fields,  # type: ignore[arg-type]
    )
    return generate(server.engine, request).image.convert("RGB").tobytes()  # type: ignore[arg-type]


def refused(response: httpx.Response, *words: str) -> str:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    for word in words:
        assert word in error, (word, error)
    return error


def test_inference_client_image_to_image_with_a_lora_header_and_with_loras(server, fixtures):
    peft = fixtures["peft"]
    client = InferenceClient(model=server.url, headers={"lora": peft}, timeout=120)
    by_header = client.image_to_image(IMAGE, prompt=PROMPT, strength=0.5, **STEPS).convert("RGB")
    expected = engine_image(server, peft, strength=0.5)
    assert by_header.size == (64, 64) and by_header.tobytes() == expected
    listed = InferenceClient(model=server.url, timeout=120).image_to_image(
        IMAGE, prompt=PROMPT, strength=0.5, loras=[{"path": peft, "scale": 1.0}], **STEPS
    )
    assert listed.convert("RGB").tobytes() == expected
    plain = InferenceClient(model=server.url, timeout=120).image_to_image(IMAGE, prompt=PROMPT, strength=0.5, **STEPS)
    assert plain.convert("RGB").tobytes() != expected


def test_a_raw_image_body_a_data_url_and_a_target_size(server):
    raw = post(server, IMAGE, **{"content-type": "image/png"})
    assert Image.open(io.BytesIO(raw.content)).size == (64, 64), raw.text[:300]
    data_url = image_body({"strength": 0.7})
    data_url["inputs"] = "data:image/png;base64," + data_url["inputs"]
    assert rgb(post(server, data_url)) == rgb(post(server, image_body({"strength": 0.7})))
    sized = post(server, image_body({"strength": 0.7, "target_size": {"width": 96, "height": 64}}))
    assert Image.open(io.BytesIO(sized.content)).size == (96, 64)


def test_a_mask_inpaints_and_one_of_another_size_is_resized_with_a_warning(server):
    mask = b64(png_bytes(example_mask()))
    inpainted = post(server, image_body({"mask_image": mask, "strength": 0.9}))
    assert rgb(inpainted) == engine_image(server, mask_image=InputImage.from_pil(example_mask(), "L"), strength=0.9)
    assert "X-Warnings" not in inpainted.headers
    small = post(server, image_body({"mask_image": b64(png_bytes(example_mask(32, 32))), "strength": 0.9}))
    assert small.status_code == 200
    assert "resized" in json.loads(small.headers["X-Warnings"])[0]


def test_bad_images_are_refused_naming_them_and_nothing_is_lost(server):
    text = {"inputs": PROMPT, "parameters": {**STEPS, "width": 64, "height": 64}}
    before = rgb(post(server, text))
    refused(post(server, image_body({}, image=b"not an image at all")), "inputs", "PNG, JPEG or WebP")
    gif = io.BytesIO()
    example_image().save(gif, format="GIF")
    refused(post(server, gif.getvalue(), **{"content-type": "image/png"}), "GIF", "accepted")
    # 2700 x 2700 black: a small PNG of 7.3 million pixels (over 4 x 1328²), refused from its header.
    bomb = png_bytes(Image.new("L", (2700, 2700)))
    refused(post(server, image_body({}, image=bomb)), "2700x2700", "MAX_INPUT_PIXELS")
    refused(post(server, image_body({"mask_image": b64(b"nope")})), "parameters.mask_image", "accepted")
    refused(post(server, image_body({"strength": 1.5})), "strength", "0 to 1")
    refused(post(server, image_body({"strength": 0})), "strength", "accepted")
    refused(post(server, image_body({"target_size": {"width": 4096, "height": 64}})), "width", "accepted")
    refused(post(server, image_body({"target_size": {"width": 64}})), "target_size", "height")
    assert rgb(post(server, text)) == before


def test_a_body_over_max_body_bytes_is_refused_before_it_is_read(server):
    response = post(server, b"0" * (32 * 2**20 + 1), **{"content-type": "image/png"})
    assert response.status_code == 413
    assert "MAX_BODY_BYTES" in response.json()["error"]


def test_concurrent_text_and_image_requests_with_different_loras_each_equal_their_single_run(server, fixtures):
    peft, kohya = fixtures["peft"], fixtures["kohya"]
    text = {"inputs": PROMPT, "parameters": {**STEPS, "width": 64, "height": 64}}
    jobs = [(text, peft), (image_body({"strength": 0.6}), kohya), (text, kohya), (image_body({"strength": 0.6}), peft)]
    alone = [rgb(post(server, body, lora=lora)) for body, lora in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: rgb(post(server, job[0], lora=job[1])), jobs))
    assert together == alone
    assert len(set(alone)) == len(alone)


@pytest.fixture(autouse=True)
def _engine(server):
    assert server.engine is not None


def test_a_data_url_prefix_is_read_within_its_first_characters_only(server):
    # The prefix is looked for in the first 256 characters, never over a whole 32 MB `inputs` (a pattern with
    # repeated parameters run over all of it backtracked for seconds with the GIL held): past them it is no prefix.
    long_prefix = "data:image/png" + ";a=b" * 80 + ";base64," + b64(IMAGE)
    refused(post(server, {"inputs": long_prefix, "parameters": {"prompt": PROMPT, **STEPS}}), "inputs is not base64")
    assert not is_image_text("data:" + ";base64" * 2**20)
    # A prompt of 6 MB that starts as a data URL would: refused by its length, as any other prompt.
    text = {"inputs": "data:" + ";base64" * 2**20, "parameters": {**STEPS, "width": 64, "height": 64}}
    refused(post(server, text), "prompt has", "characters; accepted: at most")


BAD_BODIES = [
    (b"not an image at all", {"content-type": "image/png"}),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, {"content-type": "image/png"}),
    (b"GIF89a" + b"\x00" * 40, {"content-type": "image/webp"}),
    (b"\xff\xd8\xff" + b"\x00" * 40, {"content-type": "image/jpeg"}),
    (json.dumps(image_body({}, image=b"not an image")).encode(), {}),
    (json.dumps(image_body({"mask_image": b64(b"\x89PNG\r\n\x1a\n")})).encode(), {}),
    (json.dumps({"inputs": "data:image/png;base64,%%%", "parameters": {"prompt": PROMPT}}).encode(), {}),
    (b"{not json", {}),
]


@pytest.mark.parametrize(("body", "headers"), BAD_BODIES)
def test_every_bad_input_is_refused_naming_it_never_a_python_objects_repr(server, body, headers):
    error = refused(post(server, body, **headers), "accepted")
    assert "object at 0x" not in error and "<_io." not in error
