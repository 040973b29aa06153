"""The UI's panels: layout only, each built by a named function and returned as a frozen set of components.

`app.build_demo` lays them out and wires their events; nothing here handles a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine.requests import MAX_IMAGES
from lora_catalog.hub import SORTS
from serving.demo.example import DemoExample
from serving.handlers import Handlers
from serving.ui import formatting as fmt
from serving.ui import references as refs
from serving.ui.demo_examples import examples_for, render_examples
from serving.ui.inputs import InputPanel, input_panel, prompt_control
from serving.ui.video_ui import VideoControls, low_noise_control, video_controls

__all__ = [
    "Browser",
    "ComparePanel",
    "LoraSlot",
    "RequestPanel",
    "ResultPanel",
    "api_panel",
    "browser_panel",
    "compare_panel",
    "header",
    "request_panel",
    "result_panel",
    "status_panel",
]


@dataclass(frozen=True)
class Browser:
    """The catalogue panel: filters, gallery, paging and the selected LoRA's card."""

    base: gr.Dropdown
    note: gr.Markdown
    # The Hub, or Civitai's tab (hidden when the Space runs without Civitai).
    source: gr.Radio
    sort: gr.Dropdown
    search: gr.Textbox
    gallery: gr.Gallery
    previous: gr.Button
    page_info: gr.Markdown
    next: gr.Button
    details: gr.HTML
    readiness: gr.HTML


@dataclass(frozen=True)
class LoraSlot:
    """One LoRA of the request: reference, scale, revision, weight file and its check button."""

    ref: gr.Textbox
    scale: gr.Slider
    revision: gr.Textbox
    weight: gr.Textbox
    check: gr.Button
    # Its scale on the low-noise transformer, shown for a two-stage pool (Wan 2.2 A14B: `scale` is the
    # high-noise one's there); `serving.ui.video_ui` shows and hides it with the base, and has it follow `scale`
    # until the user moves it (`low_moved`: a share link or a history entry sets it too).
    low: gr.Slider
    low_moved: gr.State
    # The steps it is active on, as fractions of the run's steps (`LoraSpec.start`/`end`; 0 and 1: all of them).
    start: gr.Number
    end: gr.Number


@dataclass(frozen=True)
class RequestPanel:
    """What to generate: prompt, an image to start from, LoRAs, size, steps, guidance, seed, and the Generate
    button."""

    prompt: gr.Textbox
    negative: gr.Textbox
    source: InputPanel
    slot: gr.Radio
    first: LoraSlot
    second: LoraSlot
    size: gr.Dropdown
    steps: gr.Slider
    guidance: gr.Slider
    sampler: gr.Dropdown
    clip_skip: gr.Slider
    num_images: gr.Slider
    recommended: gr.Checkbox
    note: gr.Markdown
    seed: gr.Number
    randomize: gr.Checkbox
    run: gr.Button
    # Frames and fps, shown for a video pool.
    video: VideoControls
    # Stops the running generation at its next step (or takes it out of the queue).
    cancel: gr.Button


@dataclass(frozen=True)
class ResultPanel:
    """The result: the image (previews while it forms), "use as input", all images of a request for several, the
    timings, a share link; and the session's history with "use these settings again"."""

    image: gr.Image
    info: gr.HTML
    gallery: gr.Gallery
    share: gr.Textbox
    history: gr.Gallery
    use_again: gr.Button
    # Puts the result into the input image, to iterate on it; or into the reference image `use_into` names.
    use_input: gr.Button
    use_into: gr.Dropdown
    # A video pool's result, shown in the image's place.
    video: gr.Video


@dataclass(frozen=True)
class ComparePanel:
    """A comparison grid: which LoRAs or scales, whether the base comes first; the grid, its cells, timings."""

    loras: gr.Textbox
    scales: gr.Textbox
    # Each LoRA's window ("active from … to …", fractions of the steps), listed as `scales` are.
    starts: gr.Textbox
    ends: gr.Textbox
    include_base: gr.Checkbox
    run: gr.Button
    grid: gr.Image
    cells: gr.Gallery
    info: gr.HTML


def header(banner: str | None) -> None:
    if banner:
        gr.Markdown(banner, elem_classes="banner", elem_id="banner")
    gr.Markdown(
        "# LoRA Switchboard\nPick a LoRA from the Hub (or name your own), write a prompt, generate. "
        "Warm pipelines, one per base model, swap LoRAs in milliseconds.",
        elem_classes="hero",
    )


def browser_panel(served: str, choices: list[tuple[str, str]], note: str, *, civitai: bool = False) -> Browser:
    source = gr.Radio(
        [("Hugging Face Hub", "hub"), ("Civitai", "civitai")],
        value="hub",
        label="Source",
        visible=civitai,
        elem_id="source-filter",
    )
    with gr.Row():
        base = gr.Dropdown(choices, value=served, label="Base model", scale=2, elem_id="base-filter")
        sort = gr.Dropdown(list(SORTS), value="downloads", label="Sort by", scale=1)
    base_note = gr.Markdown(note, elem_id="base-note")
    search = gr.Textbox(label="Search", placeholder="style, subject, trigger word… (Enter)", elem_id="lora-search")
    gallery = gr.Gallery(
        label="LoRAs",
        columns=4,
        # A page of fewer LoRAs keeps the tiles' size (Gradio stretches them to fill the row by default).
        fit_columns=False,
        height="auto",
        allow_preview=False,
        object_fit="cover",
        elem_id="lora-gallery",
        buttons=[],
    )
    with gr.Row(elem_classes="nav-row"):
        previous = gr.Button("◀ Previous", size="sm", interactive=False, scale=0)
        page_info = gr.Markdown("loading…", elem_id="page-info")
        next_button = gr.Button("Next ▶", size="sm", interactive=False, scale=0)
    details = gr.HTML("<div class='lora-card'><em>Select a LoRA to see its details.</em></div>", elem_id="lora-details")
    # Selecting a LoRA starts its preparation; this badge says when it is ready (a cache hit on Generate).
    readiness = gr.HTML("", elem_id="lora-ready")
    return Browser(base, base_note, source, sort, search, gallery, previous, page_info, next_button, details, readiness)


def request_panel(handlers: Handlers, base: gr.Dropdown) -> RequestPanel:
    defaults = handlers.default.defaults
    sizes = fmt.size_presets(defaults)
    prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", **prompt_control(defaults))
    negative = gr.Textbox(
        label="Negative prompt", lines=1, placeholder="blurry, low quality", **fmt.negative_control(defaults)
    )
    slots = refs.slot_count(handlers.pools, handlers.settings.max_reference_images)
    examples = examples_for(handlers.pools, slots)
    source = input_panel(defaults, prompt, handlers.settings.max_input_pixels, slots, edit_example=not examples)
    slot = gr.Radio(["LoRA 1", "LoRA 2", "Compare"], value="LoRA 1", label="A gallery click fills")
    first = _first_slot(defaults.two_stage, examples, (base, prompt, source))
    with gr.Accordion("Blend a second LoRA", open=False), gr.Group():
        ref_2 = gr.Textbox(label="LoRA 2 — Hub repo id, Civitai link or local: file", elem_id="lora-2")
        scale_2 = gr.Slider(-2, 2, value=1.0, step=0.05, label="LoRA 2 scale", elem_id="lora-2-scale")
        low_2 = low_noise_control(2, defaults.two_stage)
        start_2, end_2 = window_controls(2)
        revision_2 = gr.Textbox(label="Revision", placeholder="main")
        weight_2 = gr.Textbox(label="Weight file")
        check_2 = gr.Button("Check LoRA 2", size="sm")
    with gr.Row():
        size = gr.Dropdown(sizes, value=sizes[0][1], label="Size")
        steps = gr.Slider(1, handlers.settings.max_steps, value=defaults.steps, step=1, label="Steps", elem_id="steps")
        guidance = gr.Slider(0, 20, step=0.5, elem_id="guidance", **fmt.guidance_control(defaults))
    video = video_controls(defaults)
    with gr.Row():
        # Twice the others' width: "Default (DPM++ 2M Karras)" and the longer names fit beside the arrow.
        sampler = gr.Dropdown(fmt.sampler_choices(defaults), value="", label="Sampler", elem_id="sampler", scale=2)
        clip_skip = gr.Slider(**fmt.clip_skip_range(defaults), value=1, step=1, label="CLIP skip", elem_id="clip-skip")
        num_images = gr.Slider(1, MAX_IMAGES, value=1, step=1, label="Images", elem_id="num-images")
    # The switch: a LoRA's own settings (a speed LoRA's sampler, steps and guidance; its card's) fill the form.
    recommended = gr.Checkbox(True, label="Use the LoRA's recommended settings", elem_id="use-recommended")
    note = gr.Markdown("", elem_id="settings-note")
    with gr.Row():
        seed = gr.Number(-1, label="Seed", info="the seed used shows here", precision=0, minimum=-1, elem_id="seed")
        randomize = gr.Checkbox(True, label="Random seed each time", elem_id="randomize")
    with gr.Row():
        run = gr.Button("Generate", variant="primary", size="lg", elem_id="generate", scale=4)
        cancel = gr.Button("Cancel", variant="stop", size="lg", elem_id="cancel", scale=1)
    return RequestPanel(
        prompt,
        negative,
        source,
        slot,
        first,
        LoraSlot(ref_2, scale_2, revision_2, weight_2, check_2, low_2, gr.State(False), start_2, end_2),
        size,
        steps,
        guidance,
        sampler,
        clip_skip,
        num_images,
        recommended,
        note,
        seed,
        randomize,
        run,
        video,
        cancel,
    )


def _first_slot(
    two_stage: bool, examples: tuple[DemoExample, ...], form: tuple[gr.Dropdown, gr.Textbox, InputPanel]
) -> LoraSlot:
    """LoRA 1's controls; under them the offline demo's `examples`, filling them and the `form`'s base filter,
    prompt and input images."""
    with gr.Group():
        ref = gr.Textbox(
            label="LoRA 1 — Hub repo id, Civitai link or local: file",
            elem_id="lora-1",
            placeholder="owner/name, https://civitai.com/models/… or civitai:<version id> (optional)",
        )
        scale = gr.Slider(-2, 2, value=1.0, step=0.05, label="LoRA 1 scale", elem_id="lora-1-scale")
        low = low_noise_control(1, two_stage)
        start, end = window_controls(1)
        with gr.Accordion("Revision, weight file, check", open=False, elem_id="lora-1-options"):
            revision = gr.Textbox(label="Revision (branch, tag or commit)", placeholder="main")
            weight = gr.Textbox(label="Weight file", placeholder="only needed when the repo holds several")
            check = gr.Button("Check this LoRA", size="sm")
    slot = LoraSlot(ref, scale, revision, weight, check, low, gr.State(False), start, end)
    _examples_under(examples, *form, slot)
    return slot


def _examples_under(
    examples: tuple[DemoExample, ...], base: gr.Dropdown, prompt: gr.Textbox, source: InputPanel, first: LoraSlot
) -> None:
    """The offline demo's examples under LoRA 1, over the form's components by the names they fill (`base`: the
    catalogue's base filter, which the UI's request is browsed on). Its edit example (with its LoRA) takes the place
    of the input panel's, which has none."""
    fields: dict[str, Any] = {"base": base, "prompt": prompt, "source": source.editor, "references": source.references}
    fields |= {"lora": first.ref, "lora_scale": first.scale, "lora_start": first.start, "lora_end": first.end}
    render_examples(examples, fields, source.accordion)


def window_controls(slot: int) -> tuple[gr.Number, gr.Number]:
    """LoRA `slot`'s "active from step … to …" range, as fractions of the steps (the request's `start` and
    `end`: the LoRA runs at its scale on steps i with start ≤ i / steps < end, at 0 elsewhere)."""
    with gr.Row():
        start = gr.Number(
            0, minimum=0, maximum=1, step=0.05, label=f"LoRA {slot} active from (fraction of the steps, 0–1)",
            elem_id=f"lora-{slot}-start",
        )  # fmt: skip
        end = gr.Number(
            1, minimum=0, maximum=1, step=0.05, label="… to (fraction, 1: the last)", elem_id=f"lora-{slot}-end"
        )
    return start, end


def result_panel(handlers: Handlers) -> ResultPanel:
    image = gr.Image(
        label="Result",
        type="pil",
        format="png",
        interactive=False,
        elem_id="result",
        height=420,
        buttons=["download", "fullscreen"],
        elem_classes="tiny-output" if handlers.default.defaults.is_tiny else None,
        visible=not handlers.default.defaults.video,
    )
    # A video pool's result, in the image's place (`serving.ui.video_ui` switches them with the base).
    video = gr.Video(
        label="Result",
        format="mp4",
        interactive=False,
        elem_id="result-video",
        height=420,
        loop=True,
        autoplay=True,
        visible=handlers.default.defaults.video,
    )
    with gr.Row():
        use_input = gr.Button("Use as input", size="sm", elem_id="use-as-input", scale=0)
        # Where the pool takes further reference images: which image the result becomes (`wire_inputs`).
        slots = refs.slot_count(handlers.pools, handlers.settings.max_reference_images)
        use_into = gr.Dropdown(
            label="into", show_label=False, elem_id="use-into", **refs.target_control(handlers.default.defaults, slots)
        )
    gallery = gr.Gallery(
        label="Images", type="pil", format="png", columns=4, height="auto", visible=False, elem_id="result-gallery"
    )
    info = gr.HTML(elem_id="result-info")
    share = gr.Textbox(
        label="Share link: opens this Space with these LoRAs and settings",
        interactive=False,
        buttons=["copy"],
        elem_id="share-link",
    )
    with gr.Accordion("History (this browser session)", open=False, elem_id="history-panel"):
        history = gr.Gallery(
            label="Earlier results", columns=6, height="auto", allow_preview=False, elem_id="history", buttons=[]
        )
        use_again = gr.Button("Use these settings again", size="sm", interactive=False, elem_id="use-again")
    return ResultPanel(image, info, gallery, share, history, use_again, use_input, use_into, video)


def compare_panel(handlers: Handlers) -> ComparePanel:
    settings = handlers.compare_limits
    gr.Markdown(
        f"Same prompt, size, steps, guidance and seed as above; one image per LoRA (up to {settings[0]}), "
        "or one LoRA at several scales, each active on the steps of its window (every step unless set; a LoRA "
        "listed twice with two windows is two cells). A gallery click with **Compare** selected adds its LoRA here.",
        elem_classes="compare-help",
    )
    loras = gr.Textbox(
        label="LoRAs to compare, one per line", lines=3, elem_id="compare-loras", placeholder="owner/name"
    )
    with gr.Row():
        scales = gr.Textbox(
            label="Scales",
            elem_id="compare-scales",
            placeholder="1  ·  or one per LoRA  ·  or a sweep of one LoRA: 0, 0.25, 0.5, 0.75, 1",
            scale=3,
        )
        include_base = gr.Checkbox(True, label="Base model first", elem_id="compare-base", scale=1)
    with gr.Row():
        # Read by the same parser as /compare's `starts`/`ends`: empty, one for all, or one per LoRA.
        starts = gr.Textbox(
            label="Active from (fraction of the steps)", elem_id="compare-starts", placeholder="0  ·  or one per LoRA"
        )
        ends = gr.Textbox(label="to", elem_id="compare-ends", placeholder="1  ·  or one per LoRA, e.g. 1, 0.5")
    run = gr.Button("Compare", variant="primary", elem_id="compare")
    grid = gr.Image(
        label="Comparison grid",
        show_label=False,  # the grid draws its own labels; Gradio's would cover the first one
        type="pil",
        format="png",
        interactive=False,
        elem_id="compare-grid",
        buttons=["download", "fullscreen"],
    )
    cells = gr.Gallery(
        label="Cells", type="pil", format="png", columns=6, height="auto", elem_id="compare-cells", buttons=["download"]
    )
    info = gr.HTML(elem_id="compare-info")
    return ComparePanel(loras, scales, starts, ends, include_base, run, grid, cells, info)


def status_panel() -> tuple[gr.Markdown, gr.Button]:
    with gr.Accordion("Engine status", open=False, elem_id="status-panel"):
        return gr.Markdown(elem_id="engine-status"), gr.Button("Refresh", size="sm")


def api_panel() -> gr.Markdown:
    with gr.Accordion("Use via API: Python and curl", open=False, elem_id="api-panel"):
        return gr.Markdown(elem_id="api-snippets")
