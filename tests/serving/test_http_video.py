"""Text-to-video and image-to-video on `POST /`, as Hugging Face's tasks specify them and huggingface_hub builds
them: a video pool's answer is an MP4 (or the animated WebP or GIF Accept prefers) carrying its recipe.

The bodies are built by huggingface_hub 2.4's own payload helpers for its hf-inference provider
(`HFInferenceTask`, `HFInferenceBinaryInputTask`: huggingface_hub/inference/_providers/hf_inference.py), the code
`InferenceClient` would run for a URL if its provider table listed these tasks (it does not: the test below holds
that). The backend is a stand-in answering frames made in the test (tests/support/video.py), so these tests need
no engine; the tiny Wan pool's end-to-end tests are in test_video_doors.py.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.inference._providers.hf_inference import HFInferenceBinaryInputTask, HFInferenceTask
from PIL import Image

from serving.http.body import parse_body
from serving.recipes import parse_recipe
from serving.video import decode_mp4
from tests.support.app_server import serve_routes
from tests.support.video import TOLERANCE, VideoBackend, frames, mean_difference, video_result

TIMEOUT = httpx.Timeout(60.0)
PARAMETERS = {"num_frames": 5, "num_inference_steps": 2, "guidance_scale": 4.0, "seed": 11}


@pytest.fixture
def backend() -> VideoBackend:
    return VideoBackend()


@pytest.fixture
def url(backend: VideoBackend) -> Iterator[str]:
    with serve_routes(backend) as served:
        yield served


def text_to_video(url: str, prompt: str, parameters: dict) -> httpx.Request:
    """The request `InferenceClient.text_to_video` would send (its hf-inference payload helper)."""
    prepared = HFInferenceTask("text-to-video").prepare_request(
        inputs=prompt, parameters=parameters, headers={}, model=url, api_key=None
    )
    return httpx.Request("POST", prepared.url, json=prepared.json, headers=prepared.headers)


def image_to_video(url: str, image: bytes, parameters: dict) -> httpx.Request:
    """The request `InferenceClient.image_to_video` would send: `inputs` the image in base64, its `prompt` and the
    rest as parameters."""
    prepared = HFInferenceBinaryInputTask("image-to-video").prepare_request(
        inputs=image, parameters=parameters, headers={}, model=url, api_key=None
    )
    return httpx.Request("POST", prepared.url, content=prepared.data, headers=prepared.headers)


def send(request: httpx.Request, **headers: str) -> httpx.Response:
    request.headers.update(headers)
    with httpx.Client(timeout=TIMEOUT) as client:
        return client.send(request)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_huggingface_hub_refuses_both_tasks_for_a_url_before_sending():
    client = InferenceClient(model="http://127.0.0.1:9/")
    with pytest.raises(ValueError, match="Task 'text-to-video' not supported for provider 'hf-inference'"):
        client.text_to_video("a fox")
    with pytest.raises(ValueError, match="Task 'image-to-video' not supported for provider 'hf-inference'"):
        client.image_to_video(b"\x89PNG\r\n\x1a\n", prompt="a fox")


def test_text_to_video_answers_an_mp4_of_the_frames_with_its_recipe(url, backend):
    parameters = {**PARAMETERS, "negative_prompt": ["blurry", "static"], "fps": 8, "guidance_scale_2": 3.0}
    response = send(text_to_video(url, "a fox running", parameters), lora="owner/wan-style")
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"] == "video/mp4"
    assert response.headers["x-seed"] == "11"
    sent = backend.requests[-1]
    assert (sent.prompt, sent.negative_prompt, sent.num_frames, sent.fps, sent.guidance_2) == (
        "a fox running",
        "blurry, static",
        5,
        8,
        3.0,
    )
    assert [lora.ref for lora in sent.loras] == ["owner/wan-style"]
    assert sent.image is None
    decoded = decode_mp4(response.content)
    expected = video_result(sent)
    assert len(decoded.frames) == 5 and decoded.fps == 8
    for frame, made in zip(decoded.frames, expected.frames, strict=True):
        assert mean_difference(frame, made) <= TOLERANCE
    recipe = parse_recipe(decoded.comment or "")
    assert recipe.request.prompt == "a fox running"
    assert (recipe.request.num_frames, recipe.request.fps, recipe.request.guidance_2) == (5, 8, 3)


def test_image_to_video_takes_the_image_in_inputs_and_the_prompt_as_a_parameter(url, backend):
    start = frames(1)[0]
    loras = [{"path": "owner/wan-i2v", "scale": 0.7}]
    request = image_to_video(url, png(start), {**PARAMETERS, "prompt": "the fox turns", "loras": loras})
    response = send(request)
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"] == "video/mp4"
    sent = backend.requests[-1]
    assert sent.prompt == "the fox turns"
    assert sent.image is not None and (sent.image.width, sent.image.height) == start.size
    assert [(lora.ref, lora.scale) for lora in sent.loras] == [("owner/wan-i2v", 0.7)]
    assert len(decode_mp4(response.content).frames) == 5


@pytest.mark.parametrize(("accept", "kind"), [("image/webp", "WEBP"), ("image/gif", "GIF")])
def test_accept_picks_an_animated_image(url, accept, kind):
    response = send(text_to_video(url, "a fox", PARAMETERS), accept=accept)
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"] == accept
    animated = Image.open(io.BytesIO(response.content))
    assert animated.format == kind and animated.n_frames == 5


@pytest.mark.parametrize(("fps", "shown"), [(60, 7), (50, 9)])
def test_a_gif_that_drops_frames_says_so_in_its_warnings(url, fps, shown):
    """9 frames at 60 fps last 0.15 s: 7 frames of 2 hundredths (and the last of 3), the rest dropped; at 50 fps
    every frame shows."""
    response = send(text_to_video(url, "a fox", {**PARAMETERS, "num_frames": 9, "fps": fps}), accept="image/gif")
    assert response.status_code == 200, response.text[:300]
    assert Image.open(io.BytesIO(response.content)).n_frames == shown
    warnings = json.loads(response.headers.get("x-warnings", "[]"))
    dropped = [w for w in warnings if w.startswith("the GIF shows")]
    if shown == 9:
        assert dropped == []
    else:
        assert dropped == [
            "the GIF shows 7 of the 9 frames: a GIF frame lasts whole hundredths of a second, at least 2 (browsers "
            "play shorter ones at 10 a second), so 60 fps plays at 46.7 fps and the clip keeps its 0.15 s; MP4 "
            "and WebP keep every frame"
        ]
    # The MP4 keeps every frame and says nothing of it.
    mp4 = send(text_to_video(url, "a fox", {**PARAMETERS, "num_frames": 9, "fps": fps}))
    assert len(decode_mp4(mp4.content).frames) == 9 and "x-warnings" not in mp4.headers


def test_the_same_request_gives_the_same_bytes(url):
    first = send(text_to_video(url, "a fox", PARAMETERS))
    again = send(text_to_video(url, "a fox", PARAMETERS))
    assert first.status_code == again.status_code == 200
    assert first.content == again.content


def test_a_curl_body_with_a_data_url_image_is_image_to_video(url, backend):
    start = Image.new("RGB", (64, 48), (200, 40, 40))
    body = {
        "inputs": "data:image/png;base64," + base64.b64encode(png(start)).decode(),
        "parameters": {"prompt": "it glows", "num_frames": 9, "fps": 16},
    }
    response = httpx.post(url, content=json.dumps(body), timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:300]
    assert backend.requests[-1].image is not None
    assert len(decode_mp4(response.content).frames) == 9


def test_a_negative_prompt_list_of_something_else_is_refused_by_name():
    body = json.dumps({"inputs": "a fox", "parameters": {"negative_prompt": ["blurry", 3]}}).encode()
    with pytest.raises(Exception, match="negative_prompt"):
        parse_body(body, lora=None, accept=None)
