"""Start from an image: the UI's input image with its mask, the strength, and what an editing pool asks for.

One `gr.ImageEditor` holds both: its background is the input image (upload, paste or webcam) and what is painted
on it is the inpainting mask (white repainted, as diffusers reads a mask; nothing painted: image-to-image). The
strength slider takes its bounds and wording from the request's declaration (`GenerateRequest.strength`) and its
value from the pool's defaults; a pool that edits by instruction (`ModelDefaults.needs_image`: FLUX.1 Kontext,
Qwen-Image-Edit) shows how to word its prompt instead, and a pool without an image-to-image pipeline hides the
slider. "Use as input" puts a result into the editor, to iterate on it. A pool that takes further reference
images shows their slots under the editor, whose image is then "Image 1" (`serving.ui.references`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image, ImageChops

from engine.errors import InvalidRequestError
from engine.images import ACCEPTED, open_image
from engine.requests import DECLARED_FIELDS, GenerateResult, InputImage, ModelDefaults
from serving.demo.example import EDIT_PROMPT, EXAMPLE_IMAGE, EXAMPLE_PROMPT, EXAMPLE_STRENGTH, REFERENCE_IMAGES
from serving.handlers import Handlers
from serving.ui import pool_views
from serving.ui import references as refs
from serving.ui.checked_images import CheckedEditor
from serving.video import frame_count

__all__ = [
    "EDIT_PLACEHOLDER",
    "PROMPT_PLACEHOLDER",
    "STARTED",
    "InputPanel",
    "accordion_control",
    "input_note",
    "input_panel",
    "link_note",
    "mode_html",
    "prompt_control",
    "source_images",
    "strength_control",
    "video_note",
    "wire_inputs",
]

STRENGTH = DECLARED_FIELDS["strength"]
_STRENGTH_RANGE = STRENGTH.bounds()  # the slider's range: declared (0 to 1), or no import
PROMPT_PLACEHOLDER = "a fox in a forest"
# An instruction-editing pool reads the prompt as what to change in the image (Kontext's own examples read so).
EDIT_PLACEHOLDER = "what to change: make it a watercolor · add a red scarf · turn the day into night"
_EDIT_NOTE = (
    "**This model edits an image by instruction.** Give it an image below and say what to change "
    '("make it a watercolor", "add a red scarf to the fox"), not what the whole picture shows.'
)
_MASK = "#ffffff"
# The request modes that start from an image (`GenerateRequest.mode`), as a share link's `input` names them.
STARTED = ("image-to-image", "inpainting", "image-to-video")


@dataclass(frozen=True)
class InputPanel:
    """The input image (with the mask painted on it), the strength, the pool's note (an editing pool's hint) and
    a share link's word that its result started from an image."""

    accordion: gr.Accordion
    editor: gr.ImageEditor
    strength: gr.Slider
    note: gr.Markdown
    shared: gr.Markdown
    # The further reference images' slots ("Image 2", ...: the request's `images` in order), shown per pool.
    references: tuple[gr.Image, ...] = ()


def input_panel(
    defaults: ModelDefaults, prompt: gr.Textbox, max_pixels: int, slots: int = 0, *, edit_example: bool = True
) -> InputPanel:
    """The panel under the prompt; open at once on an editing pool (which takes no request without an image).
    The editor's files are held to `max_pixels` by their headers before Gradio decodes them (`CheckedEditor`);
    `slots` reference slots under it (`serving.ui.references.slot_count`), shown where the pool takes them, with
    an example edit from two of them (`edit_example`; the offline demo's, with its LoRA, is under LoRA 1)."""
    with gr.Accordion(
        "Start from an image (image-to-image; paint a mask to inpaint)", elem_id="inputs", **accordion_control(defaults)
    ) as accordion:
        editor = CheckedEditor(
            max_pixels=max_pixels,
            label=editor_label(defaults, slots),
            # As file paths (PNG: lossless), read by `engine.images`, the header judged against MAX_INPUT_PIXELS
            # first, also before Gradio's own decode of them (`CheckedEditor`).
            type="filepath",
            format="png",
            image_mode="RGBA",
            sources=("upload", "clipboard", "webcam"),
            # One layer, the mask: painted in the one colour a mask takes.
            layers=gr.LayerOptions(allow_additional_layers=False),
            brush=gr.Brush(colors=[_MASK], color_mode="fixed", default_color=_MASK),
            transforms=(),
            height=360,
            elem_id="input-image",
        )
        references = refs.reference_slots(slots, defaults, max_pixels)
        strength = gr.Slider(elem_id="strength", **strength_control(defaults))
        gr.Examples(
            [[str(EXAMPLE_IMAGE), EXAMPLE_PROMPT, EXAMPLE_STRENGTH]],
            [editor, prompt, strength],
            label="Example input (drawn by serving/demo/example.py)",
            cache_examples=False,
            api_visibility="private",
            elem_id="input-examples",
        )
        if len(references) >= 2 and edit_example:
            # An edit from two references, on any pool that takes them (no LoRA: the demo's own is under LoRA 1).
            gr.Examples(
                [[str(EXAMPLE_IMAGE), *(str(path) for path in REFERENCE_IMAGES), EDIT_PROMPT]],
                [editor, references[0], references[1], prompt],
                label="Example edit: image 1 with images 2 and 3 (a pool that takes references)",
                cache_examples=False,
                api_visibility="private",
                elem_id="reference-examples",
            )
    note = gr.Markdown(input_note(defaults, slots), elem_id="input-note")
    shared = gr.Markdown("", elem_id="input-shared")
    return InputPanel(accordion, editor, strength, note, shared, references)


def editor_label(defaults: ModelDefaults, slots: int) -> str:
    """The editor's label: "Image 1" where the pool takes further images (as the prompt names it)."""
    first = "Image 1" if refs.takes(defaults, slots) else "Input image"
    return f"{first} (paint what to repaint)"


def wire_inputs(
    handlers: Handlers,
    base: gr.Dropdown,
    pending: gr.State,
    prompt: gr.Textbox,
    source: InputPanel,
    result: gr.Image,
    use: tuple[gr.Button, gr.Dropdown],
) -> None:
    """A new base: its pool's strength, prompt hint, note and reference slots (the panel opens on an editing
    pool). "Use as input": the result becomes the input image, or the reference image the dropdown names."""
    slots = source.references
    count = len(slots)

    def pool_defaults(browsed: str) -> ModelDefaults | None:
        pool = pool_views.pool_for_base(handlers.pools, browsed) if browsed else None
        return pool.defaults if pool is not None else None

    def on_base(browsed: str, waiting: dict | None) -> tuple[Any, ...]:
        defaults = pool_defaults(browsed)
        if defaults is None:
            return (gr.skip(),) * (6 + count)
        # A share link or a history entry that chose this base brings its own strength (`wire_session`).
        linked = isinstance(waiting, dict) and waiting.get("base") == browsed
        slider = strength_control(defaults)
        if linked:
            slider.pop("value")
        panel = gr.Accordion(**accordion_control(defaults, keep=True))
        shown = (gr.Markdown(input_note(defaults, count)), gr.Textbox(**prompt_control(defaults)), panel)
        label = gr.ImageEditor(label=editor_label(defaults, count))
        target = gr.Dropdown(**refs.target_control(defaults, count))
        return gr.Slider(**slider), *shown, label, target, *refs.slot_updates(defaults, count)

    def use_result(image: Image.Image | None, target: str | None, editor: Any, browsed: str, *held: Any) -> Any:
        defaults = pool_defaults(browsed)
        shown = refs.takes(defaults, count) if defaults is not None else 0
        return refs.use_result(image, target, editor, held, shown)

    button, target = use
    options: dict[str, Any] = {"api_visibility": "private", "queue": False}
    panel = [source.strength, source.note, prompt, source.accordion, source.editor, target, *slots]
    base.change(on_base, [base, pending], panel, **options)
    chosen = [result, target, source.editor, base, *slots]
    button.click(use_result, chosen, [source.editor, source.accordion, *slots], **options)


def accordion_control(defaults: ModelDefaults, keep: bool = False) -> dict[str, Any]:
    """The panel is there where the pool takes an image, and open where it needs one (`keep`: else left as the
    user has it)."""
    control: dict[str, Any] = {"visible": any(mode in defaults.modes for mode in STARTED)}
    if defaults.needs_image or not keep:
        control["open"] = defaults.needs_image
    return control


def strength_control(defaults: ModelDefaults) -> dict[str, Any]:
    """The slider's settings for a pool: the declared range at the pool's image-to-image default; an editing pool
    re-noises only when inpainting (its edit takes the image whole), so there it is the inpainting default, said
    so; hidden where no mode of the pool takes a strength."""
    low, high = _STRENGTH_RANGE
    value = defaults.strength if defaults.strength is not None else defaults.inpaint_strength
    only = " — inpainting only: an edit takes the whole image" if defaults.strength is None else ""
    return {
        "minimum": low,
        "maximum": high,
        "step": 0.05,
        "value": high if value is None else value,
        "label": "Strength",
        "info": f"{STRENGTH.description} (runs that share of the steps){only}",
        "visible": value is not None,
    }


def prompt_control(defaults: ModelDefaults) -> dict[str, Any]:
    """The prompt box's placeholder: an instruction on an editing pool, a description elsewhere."""
    return {"placeholder": EDIT_PLACEHOLDER if defaults.needs_image else PROMPT_PLACEHOLDER}


def input_note(defaults: ModelDefaults, slots: int = 0) -> str:
    """The note under the panel: an editing pool's hint, and how to name several images in the prompt where the
    pool takes them (`slots`: the app's reference slots); else nothing."""
    notes = (_EDIT_NOTE if defaults.needs_image else "", refs.reference_hint(defaults, slots))
    return "\n\n".join(note for note in notes if note)


def link_note(mode: str, references: Sequence[str] = ()) -> str:
    """What a share link of a result made from an input image says (the link carries settings, not images); made
    from several (`references`: each one's short SHA-256, image 1 first), how many and which, in order."""
    if len(references) < 2:
        return (
            f"These settings made a result from an input image ({mode}), which a link or the history cannot "
            "carry: add an image above to make it again."
        )
    which = ", ".join(f"image {n} `{digest}`" for n, digest in enumerate(references, start=1))
    return (
        f"These settings made a result from {len(references)} images ({mode}; short SHA-256 of each: {which}), "
        f"which a link or the history cannot carry: add them above, as Image 1 to Image {len(references)} in "
        "that order, to make it again."
    )


def video_note(digest: str) -> str:
    """What a share link of an IC-LoRA's result says: it ran with a reference video (`digest`: its file's SHA-256,
    as the recipe's "Reference video" names it), which the link cannot carry."""
    return (
        f"These settings made a video from a reference video (an IC-LoRA's; the file's SHA-256 `{digest}`), which "
        "a link or the history cannot carry: add that file as the Reference video to make it again."
    )


def mode_html(result: GenerateResult) -> str:
    """The result's line: for a run from an image its mode and strength, for a video its mode (text-to-video,
    image-to-video: `GenerateResult.mode`, read from the result) and its frames; nothing for text-to-image."""
    request, mode = result.request, result.mode.capitalize()
    if result.is_video:
        clip = f"{frame_count(result)} frames at {result.fps} fps"
        start = (
            "" if request.image is None else f" from the input image at {request.image.width} × {request.image.height}"
        )
        return f'<p class="input-mode">{mode}: {clip}{start}</p>'
    if request.image is None:
        return ""
    strength = f" at strength {request.strength:g}" if request.strength is not None else ""
    masked = " (the painted mask repainted)" if request.mask_image is not None else ""
    # The checked request's image: at the output's size, or its own where the pool reads it as a reference.
    size = f"{request.image.width} × {request.image.height}"
    return f'<p class="input-mode">{mode}{strength} from the input image at {size}{masked}</p>'


def source_images(value: Mapping[str, Any] | None, max_pixels: int) -> tuple[InputImage | None, InputImage | None]:
    """The editor's value (its files' paths) as the request's image and mask: the background in RGB, and the
    painted strokes of every layer as an `L` mask (255 where painted at all); no mask where nothing is painted.
    Each file is read as `POST /` reads one (`engine.images.open_image`: at most `max_pixels`, by its header)."""
    value = value or {}
    background = _opened(value.get("background"), "the input image", max_pixels)
    if background is None:
        return None, None
    image = InputImage.from_pil(_flatten(background))
    layers = [_opened(layer, "the painted mask", max_pixels) for layer in value.get("layers") or ()]
    painted = [layer.convert("RGBA").getchannel("A") for layer in layers if layer is not None]
    painted = [alpha.point(lambda a: 255 if a else 0) for alpha in painted if alpha.getbbox() is not None]
    if not painted:
        return image, None
    mask = painted[0]
    for alpha in painted[1:]:
        mask = ImageChops.lighter(mask, alpha)
    return image, InputImage.from_pil(mask, "L")


def _opened(path: object, what: str, max_pixels: int) -> Image.Image | None:
    """The editor's file at `path` (None: none), decoded within `max_pixels`."""
    if not isinstance(path, str | Path):
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InvalidRequestError(f"{what} could not be read ({e.strerror}); accepted: {ACCEPTED}") from e
    return open_image(data, what=what, max_pixels=max_pixels)


def _flatten(image: Image.Image) -> Image.Image:
    """An RGB image; a transparent upload is laid on white, as a viewer shows it (not its hidden colours)."""
    if image.mode in ("RGBA", "LA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
