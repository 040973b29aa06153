"""The UI's input image without a browser: the editor's value as the request's image and mask, and the controls
a pool's defaults give (the strength slider from the request's declaration, an editing pool's hint)."""

from __future__ import annotations

from dataclasses import replace

from PIL import Image, ImageDraw

from engine.requests import REQUEST_FIELDS, InputImage, ModelDefaults
from serving.ui import inputs

MODES = ("text-to-image", "image-to-image", "inpainting")
DEFAULTS = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128, strength=0.3, modes=MODES)


def painted(box: tuple[int, int, int, int], size: tuple[int, int] = (64, 48)) -> Image.Image:
    """A mask layer as the editor sends it: transparent, with a white stroke over `box`."""
    layer = Image.new("RGBA", size, (0, 0, 0, 0))
    ImageDraw.Draw(layer).rectangle(box, fill=(255, 255, 255, 255))
    return layer


def test_the_painted_strokes_are_the_mask_white_where_painted():
    background = Image.new("RGBA", (64, 48), (10, 20, 30, 255))
    image, mask = inputs.source_images({"background": background, "layers": [painted((8, 8, 23, 15))]})
    assert image == InputImage.from_pil(Image.new("RGB", (64, 48), (10, 20, 30)))
    assert mask is not None and (mask.mode, mask.size) == ("L", (64, 48))
    pixels = mask.to_pil()
    assert pixels.getbbox() == (8, 8, 24, 16)
    assert set(pixels.get_flattened_data()) == {0, 255}


def test_strokes_on_several_layers_make_one_mask_and_a_faint_stroke_counts_whole():
    faint = painted((40, 30, 47, 37))
    faint.putalpha(faint.getchannel("A").point(lambda a: 40 if a else 0))
    _, mask = inputs.source_images({"background": Image.new("RGB", (64, 48)), "layers": [painted((0, 0, 7, 7)), faint]})
    assert mask is not None
    pixels = mask.to_pil()
    assert pixels.getpixel((3, 3)) == 255 and pixels.getpixel((44, 33)) == 255 and pixels.getpixel((20, 20)) == 0


def test_nothing_painted_is_image_to_image_and_no_image_is_text_to_image():
    background = Image.new("RGB", (64, 48), (1, 2, 3))
    assert inputs.source_images({"background": background, "layers": [Image.new("RGBA", (64, 48))]})[1] is None
    assert inputs.source_images({"background": None, "layers": [painted((0, 0, 4, 4))]}) == (None, None)
    assert inputs.source_images(None) == (None, None)


def test_a_transparent_upload_is_laid_on_white_not_its_hidden_colours():
    clear = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    image, _ = inputs.source_images({"background": clear, "layers": []})
    assert image is not None and set(image.to_pil().get_flattened_data()) == {(255, 255, 255)}


def test_the_strength_slider_is_the_declared_field_at_the_pools_default():
    declared = next(f for f in REQUEST_FIELDS if f.name == "strength")
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
