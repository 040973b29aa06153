"""An IC-LoRA's reference video and its two settings in a real browser, on the tiny LTX-2 pool (`MODELS=tiny-ltx2`):
the reference video uploaded in its slot, "Reference strength" and "Reference downscale" set in the boxes under it,
Generate; the result's MP4 names them in its recipe, and its share link carries them and, opened, fills the boxes
again. No LoRA is chosen: the tiny pool's catalogue has no IC-LoRA, and the video and its settings reach the
in-context call with or without one (tests/engine/families/test_ltx2_ic.py runs them with one). Without a browser:
test_video_ui.py, test_session.py."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest

from serving.recipes import VideoReference, parse_recipe
from serving.video import decode_mp4
from tests.support.app_server import AppServer, served_runtime
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, page
from tests.support.reference_video import reference_mp4

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

VIDEO = reference_mp4(frames=9, side=64)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    environment = {"MODELS": "tiny-ltx2", "MAX_INPUT_PIXELS": "4096", "MAX_VIDEO_FRAMES": "17"}
    with served_runtime(environment, tmp_path_factory.mktemp("tiny-ltx2")) as (_, served):
        yield served


def _fill(page, box: str, value: str) -> None:
    field = page.locator(f"{box} input[type=number]")
    field.fill(value)
    field.press("Enter")


@pytest.mark.timeout(900)
def test_the_reference_settings_set_in_the_boxes_are_in_the_results_recipe_and_link(page, server, tmp_path):
    from playwright.sync_api import expect

    page.goto(server.url)
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
    expect(page.locator("#share-link textarea")).to_have_value(re.compile(r"reference_strength=0\.5"), timeout=WAIT_MS)
    expect(page.locator("#share-link textarea")).to_have_value(re.compile(r"reference_downscale=2"))
    source = page.locator("#result-video video").first.get_attribute("src")
    assert source is not None
    response = page.request.get(source)
    assert response.ok, response.status
    named = parse_recipe(decode_mp4(response.body()).comment or "").reference_video
    assert named == VideoReference(hashlib.sha256(VIDEO).hexdigest(), 9, 64, 64, 0.5, 2)
    page.locator("#request-column").screenshot(path=str(SHOTS / "reference-settings.png"))
    # The share link opened: the boxes hold the run's settings again (the video itself is the user's to add).
    page.goto(page.locator("#share-link textarea").input_value())
    expect(page.locator("#reference-strength input[type=number]")).to_have_value("0.5", timeout=WAIT_MS)
    expect(page.locator("#reference-downscale input[type=number]")).to_have_value("2", timeout=WAIT_MS)
