"""The bundled example input: drawn by our own code (no third-party picture), small, and the file is that drawing."""

from __future__ import annotations

from PIL import Image, ImageChops

from serving.demo.example import (
    EXAMPLE_IMAGE,
    EXAMPLE_SIDE,
    EXAMPLE_STRENGTH,
    REFERENCE_IMAGES,
    draw_example,
    draw_reference,
)


def test_the_bundled_example_is_what_the_code_draws():
    with Image.open(EXAMPLE_IMAGE) as bundled:
        assert (bundled.format, bundled.size) == ("PNG", (EXAMPLE_SIDE, EXAMPLE_SIDE))
        # `python -m serving.demo.example` writes it again; the pixels are the drawing's exactly (PNG is lossless).
        assert ImageChops.difference(bundled.convert("RGB"), draw_example()).getbbox() is None
    assert EXAMPLE_IMAGE.stat().st_size < 16 * 1024
    assert 0 < EXAMPLE_STRENGTH < 1


def test_the_drawing_is_a_scene_not_a_flat_colour_and_scales():
    drawn = draw_example()
    assert len(drawn.getcolors(maxcolors=4096) or ()) > 50
    small = draw_example(64)
    assert small.size == (64, 64) and small.getpixel((0, 0)) == drawn.getpixel((0, 0))


def test_the_bundled_references_of_the_example_edit_are_what_the_code_draws():
    for number, path in zip((2, 3), REFERENCE_IMAGES, strict=True):
        with Image.open(path) as bundled:
            assert (bundled.format, bundled.size) == ("PNG", (EXAMPLE_SIDE, EXAMPLE_SIDE))
            assert ImageChops.difference(bundled.convert("RGB"), draw_reference(number)).getbbox() is None
        assert path.stat().st_size < 16 * 1024
    assert draw_reference(2).tobytes() != draw_reference(3).tobytes()
