"""The UI's input image without a browser: the editor's value as the request's image and mask, and the controls
a pool's defaults give (the strength slider from the request's declaration, an editing pool's hint)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from engine.errors import InvalidRequestError, LimitExceededError
from engine.images import DEFAULT_MAX_INPUT_PIXELS as PIXELS
from engine.requests import DECLARED_FIELDS, InputImage, ModelDefaults
from serving.ui import inputs

MODES = ("text-to-image", "image-to-image", "inpainting")
DEFAULTS = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128, strength=0.3, modes=MODES)


def painted(box: tuple[int, int, int, int], size: tuple[int, int] = (64, 48)) -> Image.Image:
    """A mask layer as the editor sends it: transparent, with a white stroke over `box`."""
    layer = Image.new("RGBA", size, (0, 0, 0, 0))
    ImageDraw.Draw(layer).rectangle(box, fill=(255, 255, 255, 255))
    return layer


def files(tmp_path: Path, background: Image.Image | None, *layers: Image.Image) -> dict[str, Any]:
    """The editor's value as Gradio hands it over (`type="filepath"`): each image saved as a PNG file."""

    def saved(image: Image.Image, name: str) -> str:
        image.save(tmp_path / name)
        return str(tmp_path / name)

    return {
        "background": None if background is None else saved(background, "background.png"),
        "layers": [saved(layer, f"layer{i}.png") for i, layer in enumerate(layers)],
    }


def source_images(value: dict[str, Any] | None) -> tuple[InputImage | None, InputImage | None]:
    return inputs.source_images(value, PIXELS)


def test_the_painted_strokes_are_the_mask_white_where_painted(tmp_path):
    background = Image.new("RGBA", (64, 48), (10, 20, 30, 255))
    image, mask = source_images(files(tmp_path, background, painted((8, 8, 23, 15))))
    assert image == InputImage.from_pil(Image.new("RGB", (64, 48), (10, 20, 30)))
    assert mask is not None and (mask.mode, mask.size) == ("L", (64, 48))
    pixels = mask.to_pil()
    assert pixels.getbbox() == (8, 8, 24, 16)
    assert set(pixels.get_flattened_data()) == {0, 255}


def test_strokes_on_several_layers_make_one_mask_and_a_faint_stroke_counts_whole(tmp_path):
    faint = painted((40, 30, 47, 37))
    faint.putalpha(faint.getchannel("A").point(lambda a: 40 if a else 0))
    _, mask = source_images(files(tmp_path, Image.new("RGB", (64, 48)), painted((0, 0, 7, 7)), faint))
    assert mask is not None
    pixels = mask.to_pil()
    assert pixels.getpixel((3, 3)) == 255 and pixels.getpixel((44, 33)) == 255 and pixels.getpixel((20, 20)) == 0


def test_nothing_painted_is_image_to_image_and_no_image_is_text_to_image(tmp_path):
    background = Image.new("RGB", (64, 48), (1, 2, 3))
    assert source_images(files(tmp_path, background, Image.new("RGBA", (64, 48))))[1] is None
    assert source_images(files(tmp_path, None, painted((0, 0, 4, 4)))) == (None, None)
    assert source_images(None) == (None, None)


def test_a_transparent_upload_is_laid_on_white_not_its_hidden_colours(tmp_path):
    clear = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    image, _ = source_images(files(tmp_path, clear))
    assert image is not None and set(image.to_pil().get_flattened_data()) == {(255, 255, 255)}


def test_the_strength_slider_is_the_declared_field_at_the_pools_default():
    declared = DECLARED_FIELDS["strength"]
    control = inputs.strength_control(DEFAULTS)
    assert (control["minimum"], control["maximum"], control["value"]) == (declared.low, declared.high, 0.3)
    assert control["visible"] and declared.description in control["info"]
    assert inputs.prompt_control(DEFAULTS)["placeholder"] == inputs.PROMPT_PLACEHOLDER
    assert inputs.input_note(DEFAULTS) == ""
    # The panel is there, closed until opened (or left as the user has it when the base changes).
    assert inputs.accordion_control(DEFAULTS) == {"visible": True, "open": False}
    assert inputs.accordion_control(DEFAULTS, keep=True) == {"visible": True}
    text_only = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)
    assert inputs.accordion_control(text_only)["visible"] is False


def test_an_editing_pool_asks_for_an_instruction_and_takes_a_strength_only_to_inpaint():
    editing = ModelDefaults(steps=4, guidance=2.5, side=64, max_side=128, needs_image=True, modes=("image-to-image",))
    assert inputs.accordion_control(editing, keep=True) == {"visible": True, "open": True}
    assert inputs.strength_control(editing)["visible"] is False
    # FLUX.1 Kontext's inpainting pipeline re-noises (diffusers' default 1.0); its edit takes no strength.
    inpaints = replace(editing, inpaint_strength=1.0, modes=("image-to-image", "inpainting"))
    control = inputs.strength_control(inpaints)
    assert (control["visible"], control["value"]) == (True, 1.0) and "inpainting only" in control["info"]
    assert inputs.prompt_control(editing)["placeholder"] == inputs.EDIT_PLACEHOLDER
    assert "edits an image by instruction" in inputs.input_note(editing)


def test_the_editors_files_are_read_within_max_input_pixels_by_their_headers(tmp_path):
    # A 3000 x 3000 upload (9 million pixels, over MAX_INPUT_PIXELS' 7054336): refused from its header, by name.
    big = files(tmp_path, Image.new("RGB", (3000, 3000), (9, 9, 9)))
    with pytest.raises(LimitExceededError, match=r"the input image is 3000x3000 \(9000000 pixels\); accepted: at most"):
        source_images(big)
    (tmp_path / "junk.png").write_bytes(b"not a png")
    with pytest.raises(InvalidRequestError, match="the input image is not an image") as refused:
        source_images({"background": str(tmp_path / "junk.png"), "layers": []})
    assert "object at 0x" not in str(refused.value)


def test_the_editor_refuses_a_file_over_max_input_pixels_by_its_header_before_gradio_decodes_it(tmp_path):
    """What the browser's upload reaches (tests/serving/test_browser_upload.py drives it in chromium, `slow`):
    over the cap, under twice it (where Gradio's own preprocess would decode it whole), our refusal names its size."""
    import gradio as gr
    from gradio.components.image_editor import EditorData
    from gradio.data_classes import FileData

    huge = tmp_path / "huge.png"
    Image.new("RGB", (3000, 3000), (200, 30, 30)).save(huge)
    with gr.Blocks():
        panel = inputs.input_panel(DEFAULTS, gr.Textbox(), PIXELS)
    payload = EditorData(background=FileData(path=str(huge)), layers=[], composite=FileData(path=str(huge)))
    with pytest.raises(gr.Error, match=rf"3000x3000 \(9000000 pixels\); accepted: at most {PIXELS} pixels"):
        panel.editor.preprocess(payload)
