"""Two references and an edit LoRA in a real browser on the tiny Qwen-Image-Edit-2509 pool (issue 41): the pool
opens with its input image ("Image 1") and the slots Image 2 to Image 3; a LoRA made here (declaring
Qwen-Image-Edit-Plus, as musubi-tuner writes it) is picked from the gallery, Image 1 and Image 2 are uploaded and
Generate gives an image; the same request on `POST /` (a JSON body with `parameters.images` and
`parameters.loras`) and on gradio_client's `/generate` runs as the same checked request and gives byte-identical
PNG bytes; "Use as input" into Image 2 puts the result's pixels into that slot."""

from __future__ import annotations

import base64
import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from gradio_client import handle_file
from PIL import Image

from engine.requests import InputImage
from families.qwen_image_edit_plus import MODEL_ID
from tests.support.app_server import recording_backend, serve_fixture_app
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, editor_upload, page, tile
from tests.support.clients import api_client
from tests.support.image_inputs import example_image, png_bytes
from tests.support.qwen_image import CASES, write_qwen_loras

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)

# musubi-tuner's ModelSpec architecture for a Qwen-Image-Edit-2509 LoRA (its utils/sai_model_spec.py).
PLUS_METADATA = {"modelspec.architecture": "Qwen-Image-Edit-Plus/lora"}
LORA = CASES[0]  # diffusers/PEFT naming
PROMPT = "the fox in image 1 in the colours of image 2"
# The input image and one reference, at the tests' small sides (the reference at an aspect ratio of its own).
IMAGES = ((64, 64, 0), (80, 64, 1))


def upload(page, elem_id: str, path: str) -> None:
    """A file into an image input, waited for until it shows (else Generate could send it empty)."""
    from playwright.sync_api import expect

    page.locator(f"#{elem_id} input[type=file]").set_input_files(path)
    expect(page.locator(f"#{elem_id} img").first).to_be_visible(timeout=WAIT_MS)


def shown_png(page, locator) -> bytes:
    """The bytes of the file an <img> in the page shows (its src, fetched from the app)."""
    src = locator.get_attribute("src")
    assert src is not None
    answer = page.request.get(src)
    assert answer.ok, answer.status
    return answer.body()


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def http_body(checked) -> dict[str, object]:
    """`POST /`'s JSON for the request the UI sent, from what it ran as (every value explicit)."""
    b64 = base64.b64encode
    return {
        "inputs": b64(png_bytes(example_image(*IMAGES[0]))).decode(),
        "parameters": {
            "prompt": checked.prompt,
            "negative_prompt": checked.negative_prompt,
            "num_inference_steps": checked.steps,
            "guidance_scale": checked.guidance,
            "width": checked.width,
            "height": checked.height,
            "seed": checked.seed,
            "images": [b64(png_bytes(example_image(*IMAGES[1]))).decode()],
            "loras": [{"path": lora.ref, "scale": lora.scale} for lora in checked.loras],
        },
    }


@pytest.mark.timeout(900)
def test_two_images_and_an_edit_lora_generate_the_api_gives_the_same_bytes_and_use_as_input_fills_image_2(
    page, loaded_qwen_image_edit_plus, base_settings, hub, tmp_path
):
    from playwright.sync_api import expect

    loras = tmp_path / "loras"
    loras.mkdir()
    write_qwen_loras(loaded_qwen_image_edit_plus.pipe, loras, cases=(LORA,), metadata=PLUS_METADATA)
    files = []
    for width, height, seed in IMAGES:
        path = tmp_path / f"image-{seed}.png"
        example_image(width, height, seed).save(path)
        files.append(path)
    made: list = []

    def backend(engine: object) -> object:
        made.append(recording_backend(engine))
        return made[-1]

    settings = base_settings.replace(base_model_id=MODEL_ID, local_lora_dir=loras)
    local = SimpleNamespace(local_dir=loras)
    with serve_fixture_app(loaded_qwen_image_edit_plus, settings, hub, local, backend=backend) as served:
        page.goto(served.url)
        stem = LORA.file_name.removesuffix(".safetensors")
        tile(page, stem).wait_for(timeout=WAIT_MS)
        tile(page, stem).click()
        page.locator("#lora-details", has_text=stem).wait_for(timeout=WAIT_MS)
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#randomize input").uncheck()
        steps = page.locator("#steps input[type=number]")
        steps.fill("2")
        steps.press("Enter")
        # An edit pool opens its inputs itself: Image 1 is the editor, two reference slots follow (3 in all).
        expect(page.locator("#input-image")).to_contain_text("Image 1", timeout=WAIT_MS)
        for n in (2, 3):
            expect(page.locator(f"#reference-{n}")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#reference-4")).to_have_count(0)

        editor_upload(page, str(files[0]))
        upload(page, "reference-2", str(files[1]))
        page.locator("#generate").click()

        page.locator("#result-info", has_text=f"local:{LORA.file_name}").wait_for(timeout=WAIT_MS)
        page.locator("#result-info table.timing").wait_for(timeout=WAIT_MS)
        page.locator("#request-column").screenshot(path=str(SHOTS / "edit-plus-result.png"))
        ui = made[0].outcomes.get(timeout=30)
        checked = ui.request
        assert checked.image == InputImage.from_pil(example_image(*IMAGES[0]))
        assert checked.images == (InputImage.from_pil(example_image(*IMAGES[1])),)
        assert [lora.ref for lora in checked.loras] == [f"local:{LORA.file_name}"]
        shown = shown_png(page, page.locator("#result img"))

        # The same request on POST /: the same checked request, the same PNG bytes.
        answer = httpx.post(served.url, json=http_body(checked), headers={"Accept": "image/png"}, timeout=600)
        assert answer.status_code == 200, answer.text
        # Its notes aside: the UI always sends its strength slider, which this pool notes as ignored.
        posted = made[0].outcomes.get(timeout=30).request
        assert replace(posted, notes=()) == replace(checked, notes=())
        assert answer.content == shown

        # And on gradio_client's /generate: the same again.
        (lora,) = checked.loras
        client = api_client(served.url, verbose=False)
        path, _ = client.predict(
            prompt=checked.prompt,
            negative_prompt=checked.negative_prompt,
            lora=lora.ref,
            lora_scale=lora.scale,
            steps=checked.steps,
            guidance=checked.guidance,
            width=checked.width,
            height=checked.height,
            seed=checked.seed,
            image=handle_file(str(files[0])),
            images=[handle_file(str(files[1]))],
            api_name="/generate",
        )
        # The named endpoint answers images only (`expects`, set by the door); the UI's Generate answers either kind.
        from_api = made[0].outcomes.get(timeout=30).request
        assert from_api.expects == "image"
        assert replace(from_api, notes=(), expects=None) == replace(checked, notes=())
        assert Path(path).read_bytes() == shown

        # "Use as input" into Image 2 (it held the reference): the result's pixels are there now.
        slot = page.locator("#reference-2 img").first
        before = slot.get_attribute("src") or ""
        page.locator("#use-into input").click()
        page.get_by_role("option", name="Image 2", exact=True).click()
        page.locator("#use-as-input").click()
        expect(slot).not_to_have_attribute("src", before, timeout=WAIT_MS)
        page.locator("#inputs").screenshot(path=str(SHOTS / "edit-plus-use-as-input.png"))
        assert np.array_equal(pixels(shown_png(page, slot)), pixels(shown))
