"""Starting from an image through `gradio_client`: `/generate`, `/generate_images` and `/compare` take `image`,
`mask` and `strength` (files sent with `handle_file`), on the shared app's tiny SDXL pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image, ImageDraw

from serving.demo.example import draw_example
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
        assert list(parameters)[-4:-1] == ["image", "mask", "strength"], name  # then `images`
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
        assert first.convert("RGB").tobytes() == image.tobytes(), "the first of two is /generate's for its seed"


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
