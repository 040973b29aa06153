"""An oversized upload in a real browser: a 3000 x 3000 PNG (a small file, 9 million pixels: over MAX_INPUT_PIXELS,
under twice it, where Gradio's editor would decode it whole before any check of ours) put into the UI's input image
is refused on Generate by our check from its header, naming its size and MAX_INPUT_PIXELS (never PIL's message),
and nothing reaches the engine. (A 3000 x 3000 canvas, where 4000 x 4000 at times took chromium over the wait on
two loaded cores.)

(A 12000 x 12000 PNG never gets this far here: the editor's canvas in chromium does not take it, shows nothing, and
sends nothing; `gradio_client` sends it, see tests/serving/test_client_images.py.)"""

from __future__ import annotations

import pytest
from PIL import Image

from tests.support.app_server import recording_backend, serve_fixture_app
from tests.support.browser import CHROMIUM, WAIT_MS, browser, editor_upload, page, tile

# `slow` (out of the default run, `pytest -m slow`): the editor's check itself is tests/serving/test_inputs.py's (the
# same payload, no browser). It once stalled at 38 % beside another xdist worker: the file was set before the
# editor's canvas had started, which drops it (38 % is the empty canvas's zoom); `editor_upload` now waits for the
# canvas first, and the test passed at load 5-8.
pytestmark = [pytest.mark.browser, pytest.mark.slow]
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


def test_a_3000_square_upload_is_refused_naming_max_input_pixels(page, loaded, base_settings, hub, fixtures, tmp_path):
    from playwright.sync_api import expect

    huge = tmp_path / "huge.png"
    Image.new("RGB", (3000, 3000), (200, 30, 30)).save(huge)
    made: list = []

    def backend(engine: object) -> object:
        made.append(recording_backend(engine))
        return made[-1]

    with serve_fixture_app(loaded, base_settings, hub, fixtures, backend=backend) as served:
        applied = served.engine.status().applied  # type: ignore[attr-defined]
        page.goto(served.url)
        tile(page, "peft").wait_for(timeout=WAIT_MS)
        page.locator("#prompt textarea").fill("a fox in a forest")
        page.locator("#inputs").get_by_text("Start from an image").click()
        # Generate only once the editor shows the image (else the click runs text-to-image).
        editor_upload(page, str(huge))
        page.locator("#generate").click()

        toast = page.locator(".toast-body", has_text="MAX_INPUT_PIXELS")
        expect(toast).to_be_visible(timeout=WAIT_MS)
        said = toast.inner_text()
        assert "3000x3000 (9000000 pixels)" in said, said
        assert f"at most {base_settings.max_input_pixels} pixels (MAX_INPUT_PIXELS)" in said, said
        assert "exceeds limit" not in said and "object at 0x" not in said, said
        # Refused before it was queued: no generation ran, and the engine serves what it served.
        assert made[0].outcomes.empty()
        assert served.engine.status().applied == applied  # type: ignore[attr-defined]
