"""An IC-LoRA with its reference video and its two settings in a real browser, on the tiny LTX-2 pool
(`MODELS=tiny-ltx2`, conftest.py's `server`): the IC-LoRA picked from the gallery, the reference video uploaded in its
slot, "Reference strength" and "Reference downscale" set in the boxes under it, Generate; the result's MP4 carries
its sound (an AAC track), names the LoRA and the video's settings in its recipe, is the MP4 `POST /` answers for the
same request (the LoRA's part showing: without it the video differs), and its share link carries the settings and,
opened, fills the boxes again. Without a browser: test_video_ui.py, test_session.py; the in-context run against
diffusers': tests/engine/families/test_ltx2_ic.py."""

from __future__ import annotations

import base64
import hashlib
import io
import re

import av
import httpx
import pytest

from serving.recipes import Recipe, VideoReference, parse_recipe
from serving.video import decode_mp4
from tests.support.app_server import AppServer
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, page, tile
from tests.support.ltx2 import IC_LORA, IC_TITLE
from tests.support.reference_video import reference_mp4

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

VIDEO = reference_mp4(frames=9, side=64)


def _fill(page, box: str, value: str) -> None:
    field = page.locator(f"{box} input[type=number]")
    field.fill(value)
    field.press("Enter")


def _posted(server: AppServer, recipe: Recipe, loras: bool = True) -> bytes:
    """`POST /`'s MP4 for the recipe's request (with or without its LoRAs), the reference video and its settings."""
    request = recipe.request
    parameters = {
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
        "seed": request.seed,
        "num_frames": request.num_frames,
        "fps": request.fps,
        "loras": [{"path": lora.ref, "scale": lora.scale} for lora in request.loras] if loras else [],
        "video": base64.b64encode(VIDEO).decode("ascii"),
        "reference_strength": 0.5,
        "reference_downscale": 2,
    }
    answer = httpx.post(server.url, json={"inputs": request.prompt, "parameters": parameters}, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    return answer.content


@pytest.mark.timeout(900)
def test_an_ic_lora_its_reference_video_and_settings_from_the_browser_are_post_s_run_recipe_and_link(
    page, server, tmp_path
):
    from playwright.sync_api import expect

    page.goto(server.url)
    tile(page, IC_TITLE).wait_for(timeout=WAIT_MS)
    tile(page, IC_TITLE).click()
    page.locator("#lora-details", has_text=IC_TITLE).wait_for(timeout=WAIT_MS)
    page.locator("#reference-video").wait_for(timeout=WAIT_MS)
    clip = tmp_path / "reference.mp4"
    clip.write_bytes(VIDEO)
    page.locator("#reference-video input[type=file]").set_input_files(str(clip))
    expect(page.locator("#reference-video video")).to_be_visible(timeout=WAIT_MS)
    _fill(page, "#reference-strength", "0.5")
    _fill(page, "#reference-downscale", "2")
    _fill(page, "#steps", "2")
    page.locator("#prompt textarea").fill("a fox")
    page.locator("#generate").click()
    page.locator("#result-info", has_text=f"local:{IC_LORA.file_name}").wait_for(timeout=WAIT_MS)
    expect(page.locator("#share-link textarea")).to_have_value(re.compile(r"reference_strength=0\.5"), timeout=WAIT_MS)
    expect(page.locator("#share-link textarea")).to_have_value(re.compile(r"reference_downscale=2"))
    source = page.locator("#result-video video").first.get_attribute("src")
    assert source is not None
    response = page.request.get(source)
    assert response.ok, response.status
    shown = response.body()
    # The MP4 the page plays carries LTX-2's sound: an AAC track starting with the first frame.
    with av.open(io.BytesIO(shown)) as container:
        assert container.streams.video and container.streams.audio, "the shown video has its audio stream"
        audio = container.streams.audio[0]
        assert audio.codec_context.name == "aac" and audio.start_time == 0
        assert sum(frame.samples for frame in container.decode(audio)) > 0
    recipe = parse_recipe(decode_mp4(shown).comment or "")
    assert recipe.reference_video == VideoReference(hashlib.sha256(VIDEO).hexdigest(), 9, 64, 64, 0.5, 2)
    # The IC-LoRA ran: the recipe names it (and its file's hash), and the same request on `POST /` is this MP4, byte
    # for byte, where the same run without it is another video.
    assert [lora.ref for lora in recipe.request.loras] == [f"local:{IC_LORA.file_name}"]
    assert f"local:{IC_LORA.file_name}" in recipe.hashes
    assert _posted(server, recipe) == shown
    without = decode_mp4(_posted(server, recipe, loras=False)).frames[-1]
    assert without.tobytes() != decode_mp4(shown).frames[-1].tobytes(), "the IC-LoRA must show"
    page.locator("#request-column").screenshot(path=str(SHOTS / "reference-settings.png"))
    # The share link opened: the boxes hold the run's settings again (the video itself is the user's to add).
    page.goto(page.locator("#share-link textarea").input_value())
    expect(page.locator("#reference-strength input[type=number]")).to_have_value("0.5", timeout=WAIT_MS)
    expect(page.locator("#reference-downscale input[type=number]")).to_have_value("2", timeout=WAIT_MS)
