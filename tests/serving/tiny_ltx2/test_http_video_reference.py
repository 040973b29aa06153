"""An IC-LoRA's reference video on `POST /` (`parameters.video`: an MP4, base64 or a `data:` URL) and on
gradio_client's `/generate_video` (`video`, a file, its last argument) on a tiny LTX-2 Space: it runs (the same MP4
from both doors), and each bad video is a 400 naming its rule (not a video, truncated, too many pixels, too long, a
container of endless boxes), refused before anything is decoded; the Space answers the same afterwards. The Space:
conftest.py's `server`."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import httpx
import pytest
from gradio_client import handle_file
from huggingface_hub import InferenceClient
from huggingface_hub.inference._providers import PROVIDERS
from huggingface_hub.inference._providers.hf_inference import HFInferenceTask

from serving.recipes import REFERENCE_VIDEO, VideoReference, parse_recipe
from serving.video import decode_mp4
from tests.support.app_server import AppServer
from tests.support.clients import api_client
from tests.support.ltx2 import IC_LORA
from tests.support.reference_video import endless_boxes, reference_mp4

PARAMETERS = {"num_inference_steps": 2, "seed": 5, "num_frames": 9, "fps": 24}
VIDEO = reference_mp4(frames=9, side=64)


def post(server: AppServer, video: str | None) -> httpx.Response:
    parameters = PARAMETERS if video is None else {**PARAMETERS, "video": video}
    return httpx.post(server.url, json={"inputs": "a fox", "parameters": parameters}, timeout=600)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_a_reference_video_runs_as_base64_or_a_data_url(server):
    plain, sent = post(server, None), post(server, b64(VIDEO))
    assert plain.status_code == sent.status_code == 200, sent.text[:300]
    assert sent.headers["content-type"] == "video/mp4"
    assert decode_mp4(sent.content).frames[-1].tobytes() != decode_mp4(plain.content).frames[-1].tobytes()
    as_url = post(server, "data:video/mp4;base64," + b64(VIDEO))
    assert as_url.status_code == 200 and as_url.content == sent.content


def test_an_ic_runs_recipe_names_its_reference_video_and_a_plain_runs_has_none(server):
    plain, sent = post(server, None), post(server, b64(VIDEO))
    assert plain.status_code == sent.status_code == 200, sent.text[:300]
    ic_text, plain_text = decode_mp4(sent.content).comment, decode_mp4(plain.content).comment
    assert ic_text is not None and plain_text is not None
    ic, read_plain = parse_recipe(ic_text), parse_recipe(plain_text)
    # The client's file by its SHA-256 (as `sha256sum` prints it), its frames and their size; never its bytes.
    assert ic.reference_video == VideoReference(hashlib.sha256(VIDEO).hexdigest(), 9, 64, 64)
    assert len(ic_text) < 1000 and b64(VIDEO)[:100] not in ic_text
    # Read back, the request has no video: the recipe names the file the same run needs, it does not pretend.
    assert ic.request.reference_video is None
    # A run without a video: the same recipe but for that one entry (the seed and settings are the same).
    assert read_plain.reference_video is None and REFERENCE_VIDEO not in read_plain.parameters
    assert {k: v for k, v in ic.parameters.items() if k != REFERENCE_VIDEO} == read_plain.parameters
    assert ic_text.replace(f'{REFERENCE_VIDEO}: "{ic.reference_video.text()}", ', "") == plain_text


@pytest.mark.parametrize(
    ("video", "rule"),
    [
        (b64(b"GIF89a not a video"), "parameters.video is not a video"),
        (b64(VIDEO[: len(VIDEO) // 2]), "parameters.video is a truncated MP4"),
        (b64(reference_mp4(frames=9, side=96)), "parameters.video has too many pixels: 96x96"),
        (b64(reference_mp4(frames=25, side=32)), "parameters.video is too long: 25 frames"),
        ("not base64!", "parameters.video is not base64"),
        # A zip bomb's shape (100,000 empty boxes): refused by the header walk's bound, never demuxed or decoded.
        (b64(endless_boxes(VIDEO)), "parameters.video is a container of more than 4096 boxes"),
    ],
    ids=["not-a-video", "truncated", "pixels", "frames", "not-base64", "endless-boxes"],
)
def test_each_bad_reference_video_is_a_400_naming_its_rule(server, video, rule):
    before = post(server, b64(VIDEO))
    answer = post(server, video)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert rule in error and "accepted: an MP4 video" in error, error
    assert post(server, b64(VIDEO)).content == before.content, "the Space answers the same after a refusal"


def test_gradio_client_sends_the_video_as_a_file_and_gets_post_s_mp4(server, tmp_path):
    posted = post(server, b64(VIDEO))
    assert posted.status_code == 200, posted.text[:300]
    upload = tmp_path / "reference.mp4"
    upload.write_bytes(VIDEO)
    client = api_client(server.url, verbose=False)
    path, _ = client.predict(
        prompt="a fox", steps=2, seed=5, num_frames=9, fps=24, video=handle_file(str(upload)),
        api_name="/generate_video",
    )  # fmt: skip
    assert Path(path["video"] if isinstance(path, dict) else path).read_bytes() == posted.content
    upload.write_bytes(VIDEO[: len(VIDEO) // 2])
    with pytest.raises(Exception, match="video is a truncated MP4"):
        client.predict(prompt="a fox", steps=2, video=handle_file(str(upload)), api_name="/generate_video")


def test_the_in_context_settings_come_through_both_doors_and_bad_ones_are_a_400(server, tmp_path):
    """`parameters.reference_strength` / `reference_downscale` and `/generate_video`'s last arguments of those names
    make the same MP4 (not the default's); out of range, or without a video, each a 400 naming the value."""
    settings = {"reference_strength": 0.5, "reference_downscale": 2}
    default = post(server, b64(VIDEO))
    parameters = {**PARAMETERS, "video": b64(VIDEO), **settings}
    posted = httpx.post(server.url, json={"inputs": "a fox", "parameters": parameters}, timeout=600)
    assert posted.status_code == 200, posted.text[:300]
    assert posted.content != default.content
    upload = tmp_path / "reference.mp4"
    upload.write_bytes(VIDEO)
    client = api_client(server.url, verbose=False)
    path, _ = client.predict(
        prompt="a fox", steps=2, seed=5, num_frames=9, fps=24, video=handle_file(str(upload)), **settings,
        api_name="/generate_video",
    )  # fmt: skip
    assert Path(path["video"] if isinstance(path, dict) else path).read_bytes() == posted.content
    for bad, rule in (
        ({"video": b64(VIDEO), "reference_strength": 2}, "reference_strength=2"),
        ({"video": b64(VIDEO), "reference_downscale": 3}, "reference_downscale=3 does not divide the video's 64x64"),
        ({"reference_strength": 0.5}, "reference_strength=0.5 was given without a reference video"),
    ):
        answer = httpx.post(server.url, json={"inputs": "a fox", "parameters": {**PARAMETERS, **bad}}, timeout=600)
        assert answer.status_code == 400 and rule in answer.json()["error"], answer.text[:300]
        assert "accepted:" in answer.json()["error"]
    assert post(server, b64(VIDEO)).content == default.content, "the Space answers the same after the refusals"


def test_inference_client_sends_the_in_context_settings_and_gets_gradio_client_s_mp4(server, tmp_path, monkeypatch):
    """huggingface_hub's own `InferenceClient.text_to_video`, its `extra_body` carrying the reference video and its
    settings into `parameters`, gets the MP4 `/generate_video` answers for the same request, whose recipe names
    them. Its provider table lists no text-to-video for a URL (tests/serving/test_http_video.py holds that): the
    test adds the hf-inference payload helper it would use, so the rest is the client's own code."""
    monkeypatch.setitem(PROVIDERS["hf-inference"], "text-to-video", HFInferenceTask("text-to-video"))
    settings = {"reference_strength": 0.5, "reference_downscale": 2}
    extra = {"fps": 24, "video": b64(VIDEO), **settings}
    inference = InferenceClient(model=server.url, timeout=600)
    sent = inference.text_to_video("a fox", num_inference_steps=2, seed=5, num_frames=9, extra_body=extra)
    upload = tmp_path / "reference.mp4"
    upload.write_bytes(VIDEO)
    path, _ = api_client(server.url, verbose=False).predict(
        prompt="a fox", steps=2, seed=5, num_frames=9, fps=24, video=handle_file(str(upload)), **settings,
        api_name="/generate_video",
    )  # fmt: skip
    assert Path(path["video"] if isinstance(path, dict) else path).read_bytes() == sent
    named = parse_recipe(decode_mp4(sent).comment or "").reference_video
    assert named == VideoReference(hashlib.sha256(VIDEO).hexdigest(), 9, 64, 64, 0.5, 2)


def test_an_ic_loras_trained_downscale_is_the_default_and_another_is_warned_of_over_http(server):
    """The catalogue's IC-LoRA says it was trained at `reference_downscale_factor` 1 (tests/support/ltx2.py): a
    request that sets none runs at 1, which its recipe records; one that sets 2 runs at 2, its X-Warnings naming the
    trained 1 (the engine's judgement: tests/engine/families/test_ltx2_ic.py)."""
    lora = f"local:{IC_LORA.file_name}"
    parameters = {**PARAMETERS, "video": b64(VIDEO), "loras": [{"path": lora}]}
    for downscale in (None, 2):
        sent = {**parameters, "reference_downscale": downscale}
        answer = httpx.post(server.url, json={"inputs": "a fox", "parameters": sent}, timeout=600)
        assert answer.status_code == 200, answer.text[:300]
        named = parse_recipe(decode_mp4(answer.content).comment or "").reference_video
        assert named is not None and named.downscale == (downscale or 1)
        warned = [w for w in json.loads(answer.headers.get("x-warnings", "[]")) if "reference_downscale" in w]
        assert warned == (
            []
            if downscale is None
            else [
                f"reference_downscale=2 differs from the 1 LoRA {lora!r}"
                f" (file {IC_LORA.file_name!r}) was trained with (its "
                "metadata's reference_downscale_factor); ran at 2 as asked"
            ]
        )
