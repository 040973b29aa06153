"""Further reference images in the UI: slots "Image 2", "Image 3", ... under the input image, which is "Image 1".

A pool whose own pipeline takes a list of references (`ModelDefaults.max_reference_images` over 1: the images a
request brings in all) shows that many images in all: the input image and a slot for each further one, in the
order the request's `image` and `images` run and the prompt names them ("image 1", "image 2", ...). Other pools
hide the slots (and empty them: a hidden image is never sent). The app makes as many slots as its largest pool
takes (within MAX_REFERENCE_IMAGES); each is a file path, its header held to MAX_INPUT_PIXELS before Gradio or
the request reads it, then carried as `POST /` and the Gradio API carry theirs (`api_requests.read_image`: the
file and its header's size; the engine's check decodes it).

"Use as input" puts a result into the input image, a chosen slot, or the first empty one of those shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr

from engine.errors import InvalidRequestError
from engine.images import EncodedImage
from engine.requests import ModelDefaults
from serving.ui.api_requests import read_image
from serving.ui.checked_images import CheckedImage

if TYPE_CHECKING:
    from engine.outcomes import ServedPool

__all__ = [
    "EMPTY",
    "INPUT",
    "reference_hint",
    "reference_slots",
    "references_of",
    "slot_controls",
    "slot_count",
    "slot_name",
    "target_control",
    "use_result",
]

# "Use as input" targets besides a slot's number: the input image (Image 1), or the first empty image shown.
INPUT = "input"
EMPTY = "empty"


def slot_name(index: int) -> str:
    """The keyword the slot `index` (0: "Image 2") reaches the UI's handlers by."""
    return f"reference_{index + 2}"


def slot_count(pools: Sequence[ServedPool], cap: int | None) -> int:
    """The slots the app makes: the most further references any served pool takes, within `cap` images in all
    (MAX_REFERENCE_IMAGES; None: the pools' own limits)."""
    most = max((pool.defaults.max_reference_images for pool in pools), default=0)
    if cap is not None:
        most = min(most, cap)
    return max(most - 1, 0)


def takes(defaults: ModelDefaults, count: int) -> int:
    """How many of the `count` slots a pool shows: its further references."""
    return min(max(defaults.max_reference_images - 1, 0), count)


def reference_slots(count: int, defaults: ModelDefaults, max_pixels: int) -> tuple[gr.Image, ...]:
    """The `count` slots, those the pool of `defaults` takes shown, in a row; each file's header is held to
    `max_pixels` before Gradio opens it, also after an update of the slot (`CheckedImage`)."""
    slots = []
    with gr.Row(elem_id="reference-slots"):
        for index, control in enumerate(slot_controls(defaults, count, clear=False)):
            slot = CheckedImage(
                max_pixels=max_pixels,
                what=f"Image {index + 2}",
                # A path (Gradio decodes nothing without an image_mode), read by `engine.images` as the request's.
                type="filepath",
                format="png",
                image_mode=None,
                sources=["upload", "clipboard", "webcam"],
                height=200,
                min_width=160,
                elem_id=f"reference-{index + 2}",
                elem_classes="reference-slot",
                **control,
            )
            slots.append(slot)
    return tuple(slots)


def slot_controls(defaults: ModelDefaults, count: int, *, clear: bool = True) -> list[dict[str, Any]]:
    """Each slot's settings for a pool: its label, shown where the pool takes it; a hidden one emptied (`clear`),
    so that an image it held is never sent to a pool that takes fewer."""
    shown = takes(defaults, count)
    controls: list[dict[str, Any]] = []
    for index in range(count):
        control: dict[str, Any] = {"label": f"Image {index + 2}", "visible": index < shown}
        if clear and index >= shown:
            control["value"] = None
        controls.append(control)
    return controls


def slot_updates(defaults: ModelDefaults, count: int) -> tuple[Any, ...]:
    """The slots as a new base's pool takes them (`slot_controls`)."""
    return tuple(gr.Image(**control) for control in slot_controls(defaults, count))


def target_control(defaults: ModelDefaults, count: int) -> dict[str, Any]:
    """The "Use as input" target: the input image, each slot the pool shows, or the first empty image; shown only
    where the pool takes further references (elsewhere the result goes to the input image, as before)."""
    shown = takes(defaults, count)
    choices = [("Image 1 (input image)", INPUT)] + [(f"Image {n}", str(n)) for n in range(2, shown + 2)]
    choices.append(("First empty image", EMPTY))
    return {"choices": choices, "value": INPUT, "visible": shown > 0}


def reference_hint(defaults: ModelDefaults, count: int) -> str:
    """The editing hint for a pool that takes several images: how the prompt names them (FLUX.2's and
    Qwen-Image-Edit-2509's own examples say "image 1", "image 2"; Qwen's pipeline labels them "Picture 1", ...)."""
    shown = takes(defaults, count)
    if shown == 0:
        return ""
    last = shown + 1
    return (
        f"**Several images:** this model takes up to {last}: the input image is **image 1**, then Image 2 to "
        f'Image {last} below, in that order. Name them so in the prompt: "the person in image 1 wearing the '
        'jacket from image 2".'
    )


def references_of(paths: Sequence[object], max_pixels: int, *, first: bool) -> tuple[EncodedImage, ...]:
    """The slots' files (Image 2 first) as the request's `images`, in order, each read as far as its header
    within `max_pixels` (the engine's check decodes them).
    Refused: references without the input image (`first`: the editor holds one), and a gap (an empty slot before
    a filled one): either would renumber the images, and the prompt names them by number."""
    filled = [index for index, path in enumerate(paths) if path]
    if not filled:
        return ()
    if not first:
        raise InvalidRequestError(
            f"Image {filled[0] + 2} is given but Image 1 (the input image) is empty; accepted: the input image "
            "first, then further images in order"
        )
    empty = next((index for index in range(filled[-1]) if not paths[index]), None)
    if empty is not None:
        raise InvalidRequestError(
            f"Image {filled[-1] + 2} is given but Image {empty + 2} is empty; accepted: the images in order, with "
            "no empty one between (the prompt names them by number)"
        )
    images = []
    for index, path in enumerate(paths[: filled[-1] + 1]):
        image = read_image(path, f"Image {index + 2}", "RGB", max_pixels)
        if image is not None:
            images.append(image)
    return tuple(images)


def use_result(
    result: Any, target: str | None, editor: Mapping[str, Any] | None, slots: Sequence[object], shown: int
) -> tuple[Any, ...]:
    """ "Use as input": the result put into the editor or a slot (the rest skipped), as (editor, accordion open,
    *slots); `shown`: the slots the pool shows. "First empty": the input image when it has none, else the first
    empty slot shown; none empty: a warning, nothing changed."""
    skip = (gr.skip(),) * (2 + len(slots))
    if result is None:
        return skip
    where = target or INPUT
    if where == EMPTY:
        if not (editor or {}).get("background"):
            where = INPUT
        else:
            free = next((index for index in range(min(shown, len(slots))) if not slots[index]), None)
            if free is None:
                gr.Warning("Every image is filled: choose the one the result replaces.")
                return skip
            where = str(free + 2)
    if where == INPUT:
        return result, gr.Accordion(open=True), *(gr.skip(),) * len(slots)
    index = int(where) - 2
    if not 0 <= index < len(slots):
        return skip
    out = list(skip)
    out[1] = gr.Accordion(open=True)
    out[2 + index] = result
    return tuple(out)
