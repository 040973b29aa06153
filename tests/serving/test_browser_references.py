"""Reference images in a real browser (issue 41) on the tiny FLUX.2 [klein] pool, which takes 4 images in all: the
input image is "Image 1" and the slots Image 2 to Image 4 are shown; two references uploaded into Image 2 and
Image 3 reach the request's `images` in that order (the recording backend's request, pixel for pixel), the result's
share link lists the three images' short SHA-256s, and "Use as input" into Image 4 fills that slot."""

from __future__ import annotations

import re

import pytest

from engine.requests import InputImage
from families.flux2 import MODEL_ID as KLEIN
from serving.recipes import image_hash
from tests.support.app_server import recording_backend, serve_fixture_app
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, editor_upload, page
from tests.support.image_inputs import example_image

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


def upload(page, elem_id: str, path: str) -> None:
    """A file into an image input, waited for until it shows (else Generate could send it empty)."""
    from playwright.sync_api import expect

    page.locator(f"#{elem_id} input[type=file]").set_input_files(path)
    expect(page.locator(f"#{elem_id} img").first).to_be_visible(timeout=WAIT_MS)


@pytest.mark.timeout(900)
def test_two_references_reach_the_request_in_order_and_use_as_input_fills_image_4(
    page, loaded_flux2, base_settings, hub, fixtures, tmp_path
):
    from playwright.sync_api import expect

    files = []
    for seed, size in ((0, (64, 64)), (1, (80, 64)), (2, (64, 96))):
        path = tmp_path / f"image-{seed}.png"
        example_image(*size, seed).save(path)
        files.append(path)
    made: list = []

    def backend(engine: object) -> object:
        made.append(recording_backend(engine))
        return made[-1]

    settings = base_settings.replace(base_model_id=KLEIN)
    with serve_fixture_app(loaded_flux2, settings, hub, fixtures, backend=backend) as served:
        page.goto(served.url)
        page.locator("#prompt textarea").fill("the fox in image 1 wearing the colours of image 2 and image 3")
        page.locator("#randomize input").uncheck()
        steps = page.locator("#steps input[type=number]")
        steps.fill("2")
        steps.press("Enter")
        page.locator("#inputs").get_by_text("Start from an image").click()
        # The pool takes 4 images: the editor is Image 1, three slots follow; the hint names them.
        expect(page.locator("#input-image")).to_contain_text("Image 1", timeout=WAIT_MS)
        for n in (2, 3, 4):
            expect(page.locator(f"#reference-{n}")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#reference-5")).to_have_count(0)
        expect(page.locator("#input-note")).to_contain_text("image 2", timeout=WAIT_MS)

        editor_upload(page, str(files[0]))
        upload(page, "reference-2", str(files[1]))
        upload(page, "reference-3", str(files[2]))
        page.locator("#inputs").screenshot(path=str(SHOTS / "reference-slots.png"))
        page.locator("#generate").click()

        share = page.locator("#share-link textarea")
        expect(share).to_have_value(re.compile(r"references="), timeout=WAIT_MS)
        result = made[0].outcomes.get(timeout=30)
        request = result.request
        expected = [InputImage.from_pil(example_image(*size, seed)) for seed, size in ((1, (80, 64)), (2, (64, 96)))]
        assert request.images == tuple(expected)
        digests = ",".join(image_hash(image) for image in (request.image, *request.images))
        assert f"references={digests.replace(',', '%2C')}" in share.input_value()

        # "Use as input" into Image 4 (the first three are full).
        page.locator("#use-into input").click()
        page.get_by_role("option", name="Image 4", exact=True).click()
        page.locator("#use-as-input").click()
        expect(page.locator("#reference-4 img").first).to_be_visible(timeout=WAIT_MS)
        page.locator("#inputs").screenshot(path=str(SHOTS / "reference-use-as-input.png"))
