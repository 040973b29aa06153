"""A newcomer's first minutes on the offline demo, in a real browser (issue 51): the page (its banner, and the
background pools listed as loading in the status panel), an image with a LoRA, a scheduled LoRA (the UI's example
schedule: a LoRA on the first half of the steps only, which the result's recipe and share link carry), then, once
the background pools serve, an edit from two reference images on FLUX.2 [klein] with its editing LoRA, and a short
video on Wan with its video LoRA. The app starts as `python app.py` builds it with no GPU (the real loader,
`build_runtime`), served by `tests.support.app_server`. The last two screenshots are the README's
(docs/screenshot-video.png and docs/screenshot-reference-editing.png are copied from artifacts/screenshots/)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
from PIL import Image

from serving.demo.example import EXAMPLE_IMAGE, schedule_lora, schedule_prompt
from serving.demo.later_loras import EDIT_LORA, VIDEO_LORA
from serving.recipes import parse_recipe, read_recipe
from tests.support.app_server import AppServer, served_runtime
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, editor_upload, page, tile
from tests.support.image_inputs import example_image

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, AppServer]]:
    """The offline demo as `python app.py` starts it without a GPU, its background work started at once."""
    with served_runtime({}, tmp_path_factory.mktemp("demo-tour"), ready_s=None, banner=True) as (runtime, served):
        yield runtime, served


def pick_base(page, label: str, note: str) -> None:
    page.locator("#base-filter input").click()
    page.get_by_role("option", name=f"{label} (served)").click()
    page.locator("#base-note", has_text=note).wait_for(timeout=WAIT_MS)


def few_steps(page, steps: int = 2) -> None:
    page.locator("#steps input[type=number]").fill(str(steps))
    page.locator("#steps input[type=number]").press("Enter")


@pytest.mark.timeout(1200)
def test_a_newcomer_makes_an_image_an_edit_from_two_references_and_a_video(page, demo, tmp_path):
    from playwright.sync_api import expect

    runtime, served = demo
    page.goto(served.url)
    expect(page.locator("#banner")).to_contain_text("tiny random-weight model", timeout=WAIT_MS)
    expect(page.locator("#banner")).to_contain_text("load in the background")

    # An image: a LoRA from the gallery, its trigger in the prompt, Generate.
    tile(page, "Ember Glaze").click()
    page.locator("#lora-details", has_text="Ember Glaze").wait_for(timeout=WAIT_MS)
    few_steps(page)
    page.locator("#generate").click()
    page.locator("#result-info", has_text="local:ember_glaze.safetensors").wait_for(timeout=WAIT_MS)

    # A scheduled LoRA, on the same pool (before the edit, which leaves three images an SDXL run would start from):
    # the example fills LoRA 1 with its "active from 0 to 0.5" range.
    scheduled_lora(page)

    # The background pools serve (waited on their state); the status panel lists each without "loading".
    assert runtime.backend.wait_loaded(timeout=300)  # type: ignore[attr-defined]
    page.locator("#status-panel").get_by_text("Engine status").click()
    page.get_by_role("button", name="Refresh").click()
    expect(page.locator("#status-panel")).to_contain_text("Wan", timeout=WAIT_MS)
    expect(page.locator("#status-panel")).not_to_contain_text("loading…", timeout=WAIT_MS)

    # A short video: Wan's video LoRA; the clip takes the image's place (before the edit: Wan 2.1 T2V takes no
    # input image, and the edit leaves one in the editor).
    pick_base(page, "Wan 2.1 T2V 1.3B", "generate on Wan 2.1 T2V 1.3B")
    tile(page, VIDEO_LORA.title).click()
    page.locator("#lora-details", has_text=VIDEO_LORA.title).wait_for(timeout=WAIT_MS)
    few_steps(page)
    page.locator("#generate").click()
    page.locator("#result-info", has_text=f"local:{VIDEO_LORA.file_name}").wait_for(timeout=WAIT_MS)
    expect(page.locator("#result-video video")).to_be_visible(timeout=WAIT_MS)
    page.locator("#request-column").screenshot(path=str(SHOTS / "demo-video.png"))
    # An edit from two references: FLUX.2 [klein]'s editing LoRA, the example as image 1, two more images.
    pick_base(page, "FLUX.2 [klein] 4B", "generate on FLUX.2 [klein] 4B")
    tile(page, EDIT_LORA.title).click()
    page.locator("#lora-details", has_text=EDIT_LORA.title).wait_for(timeout=WAIT_MS)
    page.locator("#prompt textarea").fill(f"{EDIT_LORA.trigger}, the lake of image 1 in the colours of image 2 and 3")
    few_steps(page)
    page.locator("#inputs").get_by_text("Start from an image").click()
    editor_upload(page, str(EXAMPLE_IMAGE))
    for n, (seed, size) in ((2, (1, (80, 64))), (3, (2, (64, 96)))):
        path = tmp_path / f"reference-{n}.png"
        example_image(*size, seed).save(path)
        page.locator(f"#reference-{n} input[type=file]").set_input_files(str(path))
        expect(page.locator(f"#reference-{n} img").first).to_be_visible(timeout=WAIT_MS)
    page.locator("#generate").click()
    edit = page.locator("#result-info", has_text=f"local:{EDIT_LORA.file_name}")
    edit.wait_for(timeout=WAIT_MS)
    page.locator("#request-column").screenshot(path=str(SHOTS / "demo-reference-editing.png"))


def scheduled_lora(page) -> None:
    """The example schedule, generated: the result's recipe (the PNG the page shows) writes the window in the LoRA's
    tag as Forge proposes it, and the share link carries it."""
    from playwright.sync_api import expect

    page.locator("#schedule-examples").get_by_text(schedule_prompt()).click()
    expect(page.locator("#lora-1 textarea, #lora-1 input").first).to_have_value(schedule_lora().ref, timeout=WAIT_MS)
    expect(page.locator("#lora-1-end input")).to_have_value("0.5", timeout=WAIT_MS)
    few_steps(page, 4)
    page.locator("#generate").click()
    page.locator("#result-info", has_text=schedule_lora().ref).wait_for(timeout=WAIT_MS)
    expect(page.locator("#share-link textarea")).to_have_value(re.compile(r"lora_end=0\.5"), timeout=WAIT_MS)
    source = page.locator("#result img").first.get_attribute("src")
    assert source is not None
    response = page.request.get(source)
    assert response.ok, response.status
    with Image.open(io.BytesIO(response.body())) as shown:
        recipe = read_recipe(shown) or ""
    # A local file's tag names it after "~" (`serving.recipes`); read back, the tag is the request's window.
    assert f"<lora:~{schedule_lora().file_name}:1:start=0:end=0.5>" in recipe, recipe
    (spec,) = parse_recipe(recipe).request.loras
    assert (spec.ref, spec.scale, spec.start, spec.end) == (schedule_lora().ref, 1.0, 0.0, 0.5)
