"""Starting from an image through `gradio_client`: `/generate`, `/generate_images` and `/compare` take `image`,
`mask` and `strength` (files sent with `handle_file`), on the shared app's tiny SDXL pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image, ImageDraw

from serving.demo.example import draw_example
from tests.support.checks import peak_rss_over
from tests.support.images import level_difference
from tests.support.reliability_app import CLIENT_GENERATE

ARGS = CLIENT_GENERATE | {"steps": 4, "seed": 5}
LEVELS = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    start, mask = folder / "start.png", folder / "mask.png"
    draw_example(64).save(start)
    painted = Image.new("L", (64, 64), 0)
    ImageDraw.Draw(painted).rectangle((16, 16, 47, 47), fill=255)
    painted.save(mask)
    return {"image": start, "mask": mask}


def generate(client: Client, **overrides: object) -> tuple[Image.Image, dict]:
    """The image, and its info with the recipe its PNG carries."""
    path, info = client.predict(**(ARGS | overrides), api_name="/generate")
    with Image.open(path) as image:
        return image.convert("RGB"), {**info, "recipe": image.info.get("parameters", "")}


def test_the_endpoints_take_an_image_a_mask_and_a_strength_defaulting_to_what_they_did(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name in ("/generate", "/generate_images", "/compare"):
        parameters = {p["parameter_name"]: p for p in endpoints[name]["parameters"]}
        # After the text-to-image fields, then `images`, then the LoRA windows (appended last, so a positional
        # call written before each existed still means what it meant).
        assert list(parameters)[-8:-5] == ["image", "mask", "strength"], name
        # None of them: text-to-image, as each endpoint made before they existed.
        assert all(parameters[n]["parameter_default"] is None for n in ("image", "mask", "strength")), name


def test_generate_from_an_image_then_paint_a_mask_through_handle_file(client, files):
    text, _ = generate(client)
    image, info = generate(client, image=handle_file(files["image"]), strength=0.5)
    assert (info["mode"], info["strength"]) == ("image-to-image", 0.5)
    assert "Denoising strength: 0.5" in info["recipe"]
    assert level_difference(image, text) > LEVELS, "the image changes what the prompt alone makes"
    again, _ = generate(client, image=handle_file(files["image"]), strength=0.5)
    assert again.tobytes() == image.tobytes(), "the same request on the same engine: the same bytes"
    painted, info = generate(client, image=handle_file(files["image"]), mask=handle_file(files["mask"]), strength=0.5)
    assert (info["mode"], info["strength"]) == ("inpainting", 0.5)
    assert "Denoising strength: 0.5" in info["recipe"]
    assert level_difference(painted, image) > LEVELS
    images, info = client.predict(
        **ARGS, num_images=2, image=handle_file(files["image"]), strength=0.5, api_name="/generate_images"
    )
    assert (len(images), info["mode"]) == (2, "image-to-image")
    with Image.open(images[0]["image"]) as first:
        # A batch of two splits its sums otherwise than one image (tests/README.md): within 2 levels, not bytes.
        assert level_difference(first.convert("RGB"), image) <= LEVELS, "the first of two is /generate's for its seed"


def test_a_comparison_starts_every_cell_from_the_image(client, files, fixtures):
    image, _ = generate(client, lora=fixtures["peft"], image=handle_file(files["image"]), strength=0.5)
    _, cells, info = client.predict(
        prompt=ARGS["prompt"], negative_prompt="", loras=fixtures["peft"], scales="", include_base=True, steps=4,
        guidance=ARGS["guidance"], width=64, height=64, seed=5, image=handle_file(files["image"]), strength=0.5,
        api_name="/compare",
    )  # fmt: skip
    assert [cell["caption"] for cell in cells] == ["base", "peft (1)"]
    assert all(cell["strength"] == 0.5 and cell["mode"] == "image-to-image" for cell in info["cells"])
    with Image.open(cells[1]["image"]) as cell:
        assert cell.convert("RGB").tobytes() == image.tobytes(), "a cell is what /generate makes for it"


def test_a_strength_without_an_image_or_out_of_range_is_refused_by_name(client, files):
    with pytest.raises(AppError, match=r"strength=0\.5 was given without an image"):
        generate(client, strength=0.5)
    with pytest.raises(AppError, match=r"strength=1\.5 .*accepted"):
        generate(client, image=handle_file(files["image"]), strength=1.5)
    with pytest.raises(AppError, match=r"mask_image was given without an image"):
        generate(client, mask=handle_file(files["mask"]))


def test_a_12000_square_png_is_refused_by_its_header_and_memory_stays_flat(client, server, tmp_path):
    # 144 million pixels of one colour: a 0.1 MB file (under MAX_BODY_BYTES), 432 MB once decoded in RGB.
    huge = tmp_path / "huge.png"
    Image.new("RGB", (12000, 12000), (200, 30, 30)).save(huge)
    applied = server.engine.status().applied
    rise, raised = peak_rss_over(lambda: generate(client, image=handle_file(huge), width=64, height=64))
    assert isinstance(raised, AppError), raised
    assert "144000000 pixels; accepted: at most 7054336 pixels (MAX_INPUT_PIXELS)" in str(raised)
    assert "object at 0x" not in str(raised)
    assert rise < 200 * 2**20, f"the server's memory rose {rise / 2**20:.0f} MiB over idle"
    # Refused before it was queued: the engine serves what it served, and the next request runs.
    assert server.engine.status().applied == applied
    generate(client)


def test_an_image_or_mask_over_max_input_pixels_is_refused_naming_it(client, tmp_path):
    # 3000 x 3000: over MAX_INPUT_PIXELS (7054336), under PIL's own limit (twice that): our check's refusal.
    big = tmp_path / "big.png"
    Image.new("L", (3000, 3000), 255).save(big)
    with pytest.raises(AppError, match=r"image is 3000x3000 \(9000000 pixels\); accepted: at most 7054336 pixels"):
        generate(client, image=handle_file(big))
    small = tmp_path / "small.png"
    draw_example(64).save(small)
    with pytest.raises(AppError, match=r"mask is 3000x3000 \(9000000 pixels\)"):
        generate(client, image=handle_file(small), mask=handle_file(big))


@pytest.mark.parametrize(
    "content", [b"not an image at all", b"GIF89a" + b"\x00" * 30, b"\x89PNG\r\n\x1a\n" + b"\x00" * 30]
)
def test_a_file_that_is_no_accepted_image_is_refused_by_name_never_a_repr(client, tmp_path, content):
    bad = tmp_path / "bad.png"
    bad.write_bytes(content)
    with pytest.raises(AppError, match="accepted: a PNG, JPEG or WebP image") as refused:
        generate(client, image=handle_file(bad))
    assert "object at 0x" not in str(refused.value)
