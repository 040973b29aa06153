"""A comparison grid as one image: the cells in a row, each under its label, on a white sheet.

Small cells (the tiny demo model's 64² images) are enlarged with NEAREST, so the grid shows the model's
own pixels and the labels stay readable; full-size cells are pasted as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

__all__ = ["grid_image"]

_MIN_CELL = 256
_GAP = 8
_INK = (17, 24, 39)
_PAPER = (255, 255, 255)


def grid_image(labels: Sequence[str], images: Sequence[Image.Image]) -> Image.Image:
    """One row: `images[i]` under `labels[i]`; every image is shown at the same size."""
    if len(labels) != len(images) or not images:
        raise ValueError(f"{len(labels)} labels for {len(images)} images; accepted: one label per image, at least one")
    width, height = images[0].size
    factor = max(1, -(-_MIN_CELL // max(width, height)))  # ceil: the smallest whole factor reaching _MIN_CELL
    cell_w, cell_h = width * factor, height * factor
    size = max(14, cell_w // 14)
    font = ImageFont.load_default(size=size)
    strip = int(size * 1.8)
    sheet = Image.new("RGB", (len(images) * (cell_w + _GAP) + _GAP, cell_h + strip + 2 * _GAP), _PAPER)
    draw = ImageDraw.Draw(sheet)
    for index, (label, image) in enumerate(zip(labels, images, strict=True)):
        left = _GAP + index * (cell_w + _GAP)
        text = _fit(draw, label, font, cell_w)
        draw.text((left + cell_w / 2, _GAP + strip / 2), text, fill=_INK, font=font, anchor="mm")
        cell = image.convert("RGB")
        if cell.size != (cell_w, cell_h):
            cell = cell.resize((cell_w, cell_h), Image.Resampling.NEAREST)
        sheet.paste(cell, (left, _GAP + strip))
    return sheet


def _fit(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: float) -> str:
    """`text`, shortened in the middle with "..." until it fits `width`."""
    if draw.textlength(text, font=font) <= width:
        return text
    keep = len(text)
    while keep > 4:
        keep -= 1
        head = (keep + 1) // 2
        shortened = f"{text[:head]}...{text[len(text) - keep // 2 :]}"
        if draw.textlength(shortened, font=font) <= width:
            return shortened
    return text[:4] + "..."
