"""The UI's reference image slots without a browser (issue 41): how many the app makes and which a pool shows (from
its `max_reference_images`, never its family), the order they reach the request's `images`, the refusals (a gap,
references without the input image, a file over MAX_INPUT_PIXELS by its header), "Use as input" into a slot, the
editing hint, and the share link's note of the images it cannot carry. The browser's side:
tests/serving/test_browser_references.py."""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
import pytest
from PIL import Image

from engine.errors import InvalidRequestError, LimitExceededError
from engine.images import DEFAULT_MAX_INPUT_PIXELS as PIXELS
from engine.outcomes import ServedPool
from engine.requests import CheckedRequest, GenerateResult, InputImage, ModelDefaults, Timings
from serving.recipes import image_hash
from serving.ui import inputs, references, session
from serving.ui.history import remember, request_of
from tests.serving.test_session import FORM_VALUES
from tests.support.image_inputs import example_image

MODES = ("text-to-image", "image-to-image")
SINGLE = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128, strength=0.6, modes=MODES, max_reference_images=1)
FOUR = replace(SINGLE, max_reference_images=4)
THREE = replace(SINGLE, needs_image=True, max_reference_images=3)
TEXT = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)


def filled_form(params: dict[str, str]) -> dict:
    """The form's values a link's parameters give, by field."""
    return dict(zip((*session.FIELDS, "randomize"), session.form_values(params, FOUR, 60), strict=True))


def pool(defaults: ModelDefaults, name: str = "me/base") -> ServedPool:
    return ServedPool(name, name, "any", defaults, False)


def saved(tmp_path: Path, name: str, image: Image.Image) -> str:
    path = tmp_path / name
    image.save(path)
    return str(path)


def test_the_app_makes_as_many_slots_as_its_largest_pool_takes_within_max_reference_images():
    pools = (pool(SINGLE), pool(FOUR), pool(THREE), pool(TEXT))
    assert references.slot_count(pools, None) == 3
    assert references.slot_count(pools, 2) == 1  # MAX_REFERENCE_IMAGES=2: the input image and one more
    assert references.slot_count((pool(SINGLE), pool(TEXT)), None) == 0
    assert references.slot_count((), None) == 0


def test_each_pool_shows_the_slots_it_takes_and_empties_those_it_hides():
    shown = references.slot_controls(FOUR, 5)
    assert [c["label"] for c in shown] == ["Image 2", "Image 3", "Image 4", "Image 5", "Image 6"]
    assert [c["visible"] for c in shown] == [True, True, True, False, False]
    # A hidden slot is emptied: its image is never sent to a pool that takes fewer.
    assert ["value" in c for c in shown] == [False, False, False, True, True]
    assert all(c["value"] is None for c in shown[3:])
    for fewer in (SINGLE, TEXT):
        assert not any(c["visible"] for c in references.slot_controls(fewer, 5))
    assert [c["visible"] for c in references.slot_controls(THREE, 5)] == [True, True, False, False, False]
    # The slots are made before any pool is chosen: nothing emptied then.
    assert all("value" not in c for c in references.slot_controls(SINGLE, 3, clear=False))


def test_the_editor_is_image_1_and_the_hint_names_the_images_by_number_where_a_pool_takes_several():
    assert inputs.editor_label(FOUR, 3).startswith("Image 1")
    assert inputs.editor_label(SINGLE, 3).startswith("Input image")
    hint = inputs.input_note(FOUR, 3)
    assert "up to 4" in hint and "image 1" in hint and "image 2" in hint and "Image 4" in hint
    assert inputs.input_note(SINGLE, 3) == "" and inputs.input_note(FOUR, 0) == ""
    # An instruction-editing pool keeps its own note, with the images' after it.
    note = inputs.input_note(THREE, 3)
    assert "edits an image by instruction" in note and "up to 3" in note


def form(tmp_path: Path, slots: list[str | None], *, first: bool = True) -> dict:
    background = saved(tmp_path, "first.png", example_image(64, 64, 0)) if first else None
    return {**FORM_VALUES, "source": {"background": background, "layers": []}, "references": slots}


def decoded(images: tuple) -> tuple[InputImage, ...]:
    return tuple(image.decoded(PIXELS) for image in images)


def test_the_slots_reach_the_requests_images_in_their_order(tmp_path):
    a = saved(tmp_path, "a.png", example_image(80, 64, 1))
    b = saved(tmp_path, "b.png", example_image(64, 96, 2))
    expected_a, expected_b = (
        InputImage.from_pil(example_image(*size, seed)) for size, seed in (((80, 64), 1), ((64, 96), 2))
    )
    request = request_of(form(tmp_path, [a, b, None]), PIXELS)
    assert request.image == InputImage.from_pil(example_image(64, 64, 0))
    # Carried as their files (the engine's check decodes them once counted), the same pixels once decoded.
    assert [image.data for image in request.images] == [Path(a).read_bytes(), Path(b).read_bytes()]
    assert decoded(request.images) == (expected_a, expected_b)
    assert decoded(request_of(form(tmp_path, [b, a]), PIXELS).images) == (expected_b, expected_a)
    assert request_of(form(tmp_path, [None, None]), PIXELS).images == ()
    assert request_of({**FORM_VALUES, "source": None}, PIXELS).images == ()  # a form without slots


def test_a_gap_references_without_the_input_image_and_an_oversized_slot_are_refused_naming_the_slot(tmp_path):
    a = saved(tmp_path, "a.png", example_image(64, 64, 1))
    with pytest.raises(InvalidRequestError, match="Image 3 is given but Image 2 is empty"):
        request_of(form(tmp_path, [None, a]), PIXELS)
    with pytest.raises(InvalidRequestError, match=r"Image 2 is given but Image 1 \(the input image\) is empty"):
        request_of(form(tmp_path, [a], first=False), PIXELS)
    big = saved(tmp_path, "big.png", Image.new("RGB", (3000, 3000)))
    with pytest.raises(LimitExceededError, match=r"Image 3 is 3000x3000 \(9000000 pixels\); accepted: at most"):
        request_of(form(tmp_path, [a, big]), PIXELS)
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    with pytest.raises(InvalidRequestError, match="Image 2 is not an image"):
        request_of(form(tmp_path, [str(junk)]), PIXELS)


def test_a_slot_refuses_a_file_over_max_input_pixels_by_its_header_before_gradio_opens_it(tmp_path):
    from gradio.data_classes import ImageData

    huge = saved(tmp_path, "huge.png", Image.new("RGB", (3000, 3000), (200, 30, 30)))
    small = saved(tmp_path, "small.png", example_image(64, 64, 3))
    with gr.Blocks():
        slots = references.reference_slots(2, FOUR, PIXELS)
    assert [slot.elem_id for slot in slots] == ["reference-2", "reference-3"]
    with pytest.raises(gr.Error, match=rf"Image 3 is 3000x3000 \(9000000 pixels\); accepted: at most {PIXELS}"):
        slots[1].preprocess(ImageData(path=huge, orig_name="huge.png"))
    assert slots[0].preprocess(ImageData(path=small, orig_name="small.png")) == small
    assert slots[0].preprocess(None) is None


def test_use_as_input_puts_the_result_into_the_chosen_slot_or_the_first_empty_image():
    result = example_image(64, 64, 5)
    skip = gr.skip()
    editor, opened, *slots = references.use_result(result, "3", {"background": "x.png"}, ["a", None, None], 3)
    assert (editor, slots) == (skip, [skip, result, skip]) and isinstance(opened, gr.Accordion)
    editor, _, *slots = references.use_result(result, references.INPUT, {"background": "x.png"}, ["a", "b"], 2)
    assert (editor, slots) == (result, [skip, skip])
    # "First empty": the input image when it has none, else the first empty slot the pool shows.
    editor, _, *slots = references.use_result(result, references.EMPTY, {"background": None}, ["a", None], 2)
    assert (editor, slots) == (result, [skip, skip])
    editor, _, *slots = references.use_result(result, references.EMPTY, {"background": "x.png"}, ["a", None], 2)
    assert (editor, slots) == (skip, [skip, result])
    # Every image shown is full (the third slot is hidden on this pool): a warning, nothing replaced.
    with pytest.warns(UserWarning, match="Every image is filled"):
        out = references.use_result(result, references.EMPTY, {"background": "x.png"}, ["a", "b", None], 2)
    assert out == (skip,) * 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert references.use_result(None, "2", None, [None], 1) == (skip,) * 3


def test_the_use_as_input_target_offers_the_slots_a_pool_shows():
    control = references.target_control(FOUR, 5)
    assert [value for _, value in control["choices"]] == [references.INPUT, "2", "3", "4", references.EMPTY]
    assert control["visible"] and control["value"] == references.INPUT
    assert references.target_control(SINGLE, 5)["visible"] is False


def test_a_share_link_lists_the_images_it_cannot_carry_by_their_short_sha256_in_order():
    first, second, third = (InputImage.from_pil(example_image(64, 64, seed)) for seed in (0, 1, 2))
    checked = CheckedRequest(
        prompt="the fox in image 1 with image 2's hat",
        steps=4,
        guidance=1.0,
        width=64,
        height=64,
        seed=3,
        image=first,
        images=(second, third),
        strength=None,
    )
    done = GenerateResult(example_image(), 3, checked, Timings())
    link, _, _ = remember(FORM_VALUES, done, "https://me-space.hf.space/")
    query = dict(parse_qsl(urlsplit(link).query))
    digests = [image_hash(image) for image in (first, second, third)]
    assert query["references"] == ",".join(digests) and query["input"] == "image-to-image"
    note = filled_form(query)["input"]
    assert "3 images" in note and "Image 1 to Image 3" in note
    assert all(f"image {n} `{digest}`" in note for n, digest in enumerate(digests, start=1))
    # A single image's link says so as before; a link's odd `references` is not shown.
    single = remember(FORM_VALUES, replace(done, request=replace(checked, images=())), "https://s/")[0]
    assert "references" not in dict(parse_qsl(urlsplit(single).query))
    odd = filled_form({**query, "references": "<b>,1"})["input"]
    assert "3 images" not in odd and "add an image above" in odd


def test_compare_starts_every_cell_from_the_same_images_in_order(tmp_path):
    from types import SimpleNamespace

    from serving.ui.events import _starting

    handlers = SimpleNamespace(settings=SimpleNamespace(max_input_pixels=PIXELS))
    a = saved(tmp_path, "a.png", example_image(64, 64, 1))
    b = saved(tmp_path, "b.png", example_image(64, 64, 2))
    source = form(tmp_path, [])["source"]
    starting = _starting(source, 0.5, [b, a], handlers)  # type: ignore[arg-type]
    expected = tuple(InputImage.from_pil(example_image(64, 64, seed)) for seed in (2, 1))
    assert decoded(starting["images"]) == expected and starting["image"] == InputImage.from_pil(
        example_image(64, 64, 0)
    )
    with pytest.raises(InvalidRequestError, match="Image 1 \\(the input image\\) is empty"):
        _starting(None, 0.5, [a], handlers)  # type: ignore[arg-type]


def test_a_slot_keeps_its_header_check_after_the_base_changes(tmp_path):
    """A new base's slots (hidden, emptied, shown again) pass through Gradio's own update of the session's
    components, which answers each with a new slot built from its constructor's arguments; the slots the next event
    reads still refuse a file over MAX_INPUT_PIXELS by its header (`serving.ui.checked_images`)."""
    from gradio.state_holder import SessionState

    huge = saved(tmp_path, "huge.png", Image.new("RGB", (3000, 3000), (200, 30, 30)))
    small = saved(tmp_path, "small.png", example_image(64, 64, 3))
    with gr.Blocks() as demo:
        slots = references.reference_slots(2, FOUR, PIXELS)
        base = gr.Dropdown(["me/single", "me/four"], value="me/four")
        shown = gr.Textbox()
        held = {"me/single": SINGLE, "me/four": FOUR}

        def on_base(browsed: str) -> tuple:
            return references.slot_updates(held[browsed], len(slots))

        def read(first: str | None, second: str | None) -> str:
            return f"{first} {second}"

        base.change(on_base, base, list(slots))
        gr.Button().click(read, list(slots), shown)
    events = {fn.fn.__name__: fn for fn in demo.fns.values()}
    state = SessionState(demo)
    for browsed in ("me/single", "me/four"):
        asyncio.run(demo.postprocess_data(events["on_base"], list(on_base(browsed)), state))
    assert all(state[slot._id] is not slot for slot in slots)  # the session's own, new, slots are read
    files = [
        {"path": path, "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}} for path in (small, huge)
    ]
    with pytest.raises(gr.Error, match=rf"Image 3 is 3000x3000 \(9000000 pixels\); accepted: at most {PIXELS}"):
        asyncio.run(demo.preprocess_data(events["read"], files, state, explicit_call=True))
    first, second = asyncio.run(demo.preprocess_data(events["read"], [files[0], None], state, explicit_call=True))
    # The path of Gradio's copy of the upload in its cache, unopened.
    assert Path(first).read_bytes() == Path(small).read_bytes() and second is None


def test_the_input_image_keeps_its_header_check_after_use_as_input_fills_a_slot(tmp_path):
    """ "Use as input" into a slot answers the input image's editor with `gr.skip()`, which Gradio answers with a new
    editor in the session; the editor the next event reads still refuses a file over MAX_INPUT_PIXELS by its header,
    and still hands a small one over as its paths."""
    from gradio.state_holder import SessionState

    huge = saved(tmp_path, "huge.png", Image.new("RGB", (3000, 3000), (200, 30, 30)))
    small = saved(tmp_path, "small.png", example_image(64, 64, 3))
    with gr.Blocks() as demo:
        panel = inputs.input_panel(FOUR, gr.Textbox(), PIXELS, slots=2)
        result = gr.Image()
        shown = gr.Textbox()

        def use(image: Image.Image) -> tuple:
            return references.use_result(image, "2", {"background": small}, [None, None], 2)

        def read(value: dict | None) -> str:
            return str(value)

        gr.Button().click(use, result, [panel.editor, panel.accordion, *panel.references])
        gr.Button().click(read, panel.editor, shown)
    events = {fn.fn.__name__: fn for fn in demo.fns.values()}
    state = SessionState(demo)
    asyncio.run(demo.postprocess_data(events["use"], list(use(example_image(64, 64, 5))), state))
    assert state[panel.editor._id] is not panel.editor  # the session's own, new, editor is read

    def editor_value(path: str) -> dict:
        file = {"path": path, "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}}
        return {"background": file, "layers": [], "composite": file, "id": None}

    with pytest.raises(gr.Error, match=rf"the input image is 3000x3000 \(9000000 pixels\); accepted: at most {PIXELS}"):
        asyncio.run(demo.preprocess_data(events["read"], [editor_value(huge)], state, explicit_call=True))
    (read_back,) = asyncio.run(demo.preprocess_data(events["read"], [editor_value(small)], state, explicit_call=True))
    assert inputs.source_images(read_back, PIXELS)[0] == InputImage.from_pil(example_image(64, 64, 3))


def test_the_browser_is_given_gradios_own_image_and_editor_with_every_prop():
    """The checked slot and editor (`serving.ui.checked_images`) reach the browser as Gradio's Image and ImageEditor,
    each with the props a plain one of the same arguments has (their limit is none of them)."""
    with gr.Blocks():
        panel = inputs.input_panel(FOUR, gr.Textbox(), PIXELS, slots=1)
    for checked, plain in ((panel.references[0], gr.Image), (panel.editor, gr.ImageEditor)):
        config = checked.get_config()
        assert checked.get_block_name() == plain(render=False).get_block_name()
        assert config.keys() == plain(render=False).get_config().keys() and config["type"] == "filepath"
