"""The tiny Wan pool through every door (`MODELS=tiny-wan`, as the app starts it on a machine without a GPU): the
same request's video from `POST /`, gradio_client's `/generate_video`, the backend the UI calls and the UI in a
browser is the same MP4, byte for byte; it decodes to the frames the pipeline made; the browser plays it, its
result line reads Text-to-video, and its share link and history keep its frames and rate.

The tiny pipeline's random weights make noise-like frames, the hardest content for 4:2:0 (chroma detail at the
pixel scale is averaged away) and for CRF 18: decoded frames are within a mean of 16 levels per channel of the
pipeline's (measured 3 to 10 on its 5 frames at 64 px), and each is nearer its own frame than any other, so count
and order are checked too. Smooth frames meet 4 levels (test_video.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.requests import GenerateRequest
from serving.handlers import Handlers
from serving.video import decode_mp4, video_file
from tests.support.app_server import AppServer, served_runtime
from tests.support.browser import CHROMIUM, WAIT_MS, browser, page
from tests.support.clients import api_client
from tests.support.video import mean_difference

__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

PROMPT, SEED, STEPS = "a fox running through snow", 5, 2
# What `POST /` takes for this request (the tiny pool's own 5 frames and 16 fps, set explicitly).
BODY = {"inputs": PROMPT, "parameters": {"num_inference_steps": STEPS, "seed": SEED, "num_frames": 5, "fps": 16}}
NOISE_TOLERANCE = 16.0


@pytest.fixture(scope="module")
def wan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AppServer, Handlers]]:
    with served_runtime({"MODELS": "tiny-wan"}, tmp_path_factory.mktemp("tiny-wan")) as (runtime, served):
        yield served, Handlers(runtime.backend, runtime.catalog, runtime.settings)


@pytest.fixture(scope="module")
def posted(wan) -> bytes:
    server, _ = wan
    answer = httpx.post(server.url, json=BODY, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"] == "video/mp4"
    return answer.content


def test_post_gradio_client_and_the_backend_give_the_same_mp4(wan, posted):
    server, handlers = wan
    client = api_client(server.url, verbose=False)
    path, info = client.predict(
        prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=5, fps=16, api_name="/generate_video"
    )  # fmt: skip
    assert Path(path["video"] if isinstance(path, dict) else path).read_bytes() == posted
    assert (info["num_frames"], info["fps"], info["seed"]) == (5, 16, SEED)
    request = GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=5, fps=16)
    result = asyncio.run(handlers.generate(request, transport="ui"))
    assert video_file(result) == posted


def test_the_mp4_decodes_to_the_pipelines_frames_with_its_recipe(wan, posted):
    _, handlers = wan
    request = GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=5, fps=16)
    made = asyncio.run(handlers.backend.generate(request)).frames
    decoded = decode_mp4(posted)
    assert len(decoded.frames) == len(made) == 5 and decoded.fps == 16
    for index, frame in enumerate(decoded.frames):
        differences = [mean_difference(frame, source) for source in made]
        assert differences[index] <= NOISE_TOLERANCE, (index, differences)
        assert differences[index] == min(differences), (index, differences)
    assert decoded.comment is not None and decoded.comment.startswith(PROMPT)
    assert "Frames: 5, FPS: 16" in decoded.comment


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
@pytest.mark.timeout(900)
def test_the_ui_plays_the_same_video(page, wan, posted):
    from playwright.sync_api import expect

    server, _ = wan
    page.goto(server.url)
    page.locator("#video-controls").wait_for(timeout=WAIT_MS)
    page.locator("#prompt textarea").fill(PROMPT)
    for field, value in (("#steps", STEPS), ("#seed", SEED)):
        page.locator(f"{field} input[type=number]").fill(str(value))
        page.locator(f"{field} input[type=number]").press("Enter")
    page.locator("#randomize input").uncheck()
    page.locator("#generate").click()
    video = page.locator("#result-video video")
    video.wait_for(timeout=WAIT_MS)
    page.wait_for_function(
        "() => { const v = document.querySelector('#result-video video'); return v && v.duration > 0; }",
        timeout=WAIT_MS,
    )
    assert video.evaluate("v => v.duration") > 0
    # The video took the image result's place (which showed the forming first frame while it denoised).
    assert not page.locator("#result").is_visible()
    source = video.get_attribute("src")
    assert source is not None
    answer = page.request.get(source if source.startswith("http") else server.url.rstrip("/") + source)
    assert answer.ok, answer.status
    assert answer.body() == posted
    # The result's line says what it is; the share link and the history keep its frames and rate.
    expect(page.locator("#result-info .input-mode")).to_have_text("Text-to-video: 5 frames at 16 fps", timeout=WAIT_MS)
    share = page.locator("#share-link textarea, #share-link input").first
    expect(share).to_have_value(re.compile(r"num_frames=5&fps=16"), timeout=WAIT_MS)
    frames = page.locator("#num-frames input[type=number]")
    frames.fill("9")
    frames.press("Enter")
    page.locator("#history-panel").get_by_text("History (this browser session)").click()
    page.locator("#history button.thumbnail-item").first.click()
    page.locator("#use-again").click()
    expect(frames).to_have_value("5", timeout=WAIT_MS)
