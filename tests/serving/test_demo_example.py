"""The bundled example input: drawn by our own code (no third-party picture), small, and the file is that drawing."""

from __future__ import annotations

from PIL import Image, ImageChops

from engine.images import DEFAULT_MAX_INPUT_PIXELS as PIXELS
from serving.demo.example import (
    EXAMPLE_IMAGE,
    EXAMPLE_SIDE,
    EXAMPLE_STRENGTH,
    REFERENCE_IMAGES,
    SCHEDULE_SCALE,
    demo_examples,
    draw_example,
    draw_reference,
    schedule_lora,
)
from serving.ui.history import FORM, request_of


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


def test_each_demo_example_is_a_request_for_its_lora_on_its_base():
    """The offline demo's examples (a schedule, an edit from two references, a video), loaded into the form as a
    click does (`form_values`, by the form's names) and made the request the UI sends: each names its LoRA, whose
    trigger leads the prompt, on the base the example sets the base filter to (its pool's)."""
    from serving.demo.later_loras import EDIT_LORA, KLEIN_MODEL_ID, VIDEO_LORA, WAN_MODEL_ID
    from serving.demo.loras import DEFAULT_MODEL_ID

    expected = {
        "schedule-examples": (schedule_lora(), DEFAULT_MODEL_ID),
        "reference-examples": (EDIT_LORA, KLEIN_MODEL_ID),
        "video-examples": (VIDEO_LORA, WAN_MODEL_ID),
    }
    examples = {example.elem_id: example for example in demo_examples()}
    assert examples.keys() == expected.keys()
    for elem_id, example in examples.items():
        lora, base = expected[elem_id]
        values = example.form_values()
        assert values["base"] == base == example.lora.base, elem_id
        request = request_of(_form(values), PIXELS)
        (spec,) = request.loras
        assert spec.ref == lora.ref and request.prompt.startswith(lora.trigger), elem_id
    schedule = request_of(_form(examples["schedule-examples"].form_values()), PIXELS)
    # From 0 is every step's start (sent unset); the window ends half-way.
    assert (schedule.loras[0].scale, schedule.loras[0].start, schedule.loras[0].end) == (SCHEDULE_SCALE, None, 0.5)
    edit = request_of(_form(examples["reference-examples"].form_values()), PIXELS)
    assert edit.image is not None and len(edit.images) == len(REFERENCE_IMAGES) == 2
    video = request_of(_form(examples["video-examples"].form_values()), PIXELS)
    assert video.image is None and video.loras[0].start is None and video.loras[0].end is None


def _form(values: dict) -> dict:
    """The UI form with `values` set (as a click on the example leaves it): the editor's value names its
    background image, as Gradio hands it over; every other field as the form starts."""
    form = {**dict.fromkeys(FORM), "negative": "", "lora_revision": "", "lora_weight": "", "lora_2": ""}
    form |= {"lora_2_scale": 1.0, "lora_2_revision": "", "lora_2_weight": "", "size": "64x64", "steps": 4}
    form |= {"guidance": 5.0, "sampler": "", "images": 1, "clip_skip": 1, "recommended": True, "seed": 3}
    form |= {"randomize": False, "history": [], "strength": 0.6, "lora_2_start": 0.0, "lora_2_end": 1.0}
    source = values.get("source")
    editor = {"background": source, "layers": [], "composite": source} if source else None
    return form | values | {"source": editor}
