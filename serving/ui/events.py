"""The UI's events: what each click, selection and submit calls (the shared handlers) and shows (formatting).

`app.build_demo` lays the panels out and hands them here. Generations and comparisons wait on the backend's
one queue (no Gradio concurrency limit, no thread held while queued); catalogue pages and LoRA checks use
small Gradio concurrency groups of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from engine.requests import GenerateRequest, GenerateResult
from serving.errors import user_errors
from serving.handlers import Handlers
from serving.streaming import Frame
from serving.ui import comparison as comparison_fields
from serving.ui import formatting as fmt
from serving.ui import history as history_ui
from serving.ui import pools as pool_ui
from serving.ui import video_ui
from serving.ui.gradio_api import PIPELINE, compare, generate
from serving.ui.history import FORM, WINDOW
from serving.ui.inputs import mode_html, source_images
from serving.ui.panels import ComparePanel, RequestPanel, ResultPanel
from serving.ui.references import references_of, slot_name
from serving.ui.snippets import base_url

__all__ = ["PRIVATE", "wire_compare", "wire_generation", "wire_status"]

# Events of the UI itself: not part of the named API that gradio_client sees.
PRIVATE = "private"


def wire_generation(
    handlers: Handlers,
    request: RequestPanel,
    base: gr.Dropdown,
    result: ResultPanel,
    status_md: gr.Markdown,
    states: tuple[gr.State, gr.State],
) -> None:
    """The Generate and Cancel buttons, and the video controls' switch; `states`: the session's history and the
    form values waiting for the base filter's change (a history entry's or a share link's)."""
    history, pending = states
    generate_ui = _generate_ui(handlers)
    slots = [
        getattr(lora, field) for lora in (request.first, request.second) for field in ("ref", "revision", "weight")
    ]
    inputs = [request.prompt, request.negative, *slots[:3], request.first.scale, *slots[3:], request.second.scale]
    inputs += [request.size, request.steps, request.guidance, request.sampler, request.clip_skip, request.num_images]
    inputs += [request.recommended, request.seed, request.randomize, request.source.editor, request.source.strength]
    inputs += [base, history]
    assert len(inputs) == len(FORM)
    # Beside the form (read by `video_ui.video_request`; a history entry and a share link keep them too).
    inputs += [request.video.frames, request.video.fps]
    # And each LoRA's low-noise scale (read only where the browsed pool has two stages).
    inputs += [request.first.low, request.second.low]
    # And each LoRA's "active from … to …" range (fractions of the steps), by name (`WINDOW`) with the references.
    ranges = (request.first.start, request.first.end, request.second.start, request.second.end)
    windows = dict(zip(WINDOW, ranges, strict=True))
    outputs = [result.image, result.info, request.seed, status_md, result.gallery, result.share, result.history]
    generating = gr.on(
        [request.run.click, request.prompt.submit],
        generate_ui,
        inputs,
        [*outputs, history, result.use_again, result.video],
        concurrency_id=PIPELINE,
        # The scheduler is the one queue and limit for every transport: Gradio hands generations over at once
        # (they wait on the scheduler, holding no thread), rather than keeping a second queue.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress_on=[result.image, result.video],
        # The reference slots by name (as many as the app made: `slot_name`), after the form.
        inputs_kwargs=_slots(request) | windows | {CLIP: request.video.reference} | _in_context(request),
    )
    # Gradio cancels the event's task: the stream closes, which takes the request out of the queue or stops its
    # run at the next step (the engine's cancel), as a browser that went away does.
    request.cancel.click(None, None, None, cancels=[generating], api_visibility=PRIVATE, queue=False)
    slots = [(slot.scale, slot.low, slot.low_moved) for slot in (request.first, request.second)]
    video_ui.wire_video(handlers, base, request.video, (result.video, result.image), pending, slots)


# The IC-LoRA reference video's slot, handed to the Generate event by name (`video_ui.video_request` reads it).
CLIP = "reference_video"


def _in_context(request: RequestPanel) -> dict[str, Any]:
    """The reference video's settings by name (`video_ui.IN_CONTEXT`: `/generate_video`'s names)."""
    return dict(zip(video_ui.IN_CONTEXT, request.video.settings, strict=True))


def _slots(request: RequestPanel) -> dict[str, Any]:
    return {slot_name(index): slot for index, slot in enumerate(request.source.references)}


def _in_order(references: dict[str, Any]) -> list[Any]:
    """The reference slots' values handed over by name, Image 2 first."""
    return [references.get(slot_name(index)) for index in range(len(references))]


def _generate_ui(handlers: Handlers) -> Callable[..., AsyncIterator[tuple[Any, ...]]]:
    """The Generate button's handler; Gradio reads its parameters (the form, the page, its progress)."""

    async def generate_ui(
        prompt: str,
        negative: str,
        ref: str,
        revision: str,
        weight: str,
        scale: float,
        ref_2: str,
        revision_2: str,
        weight_2: str,
        scale_2: float,
        size: str,
        steps: float,
        guidance: float,
        sampler: str,
        clip_skip: float,
        num_images: float,
        recommended: bool,
        seed: float | None,
        randomize: bool,
        source: dict | None,
        strength: float | None,
        browsed: str,
        kept: list,
        num_frames: float,
        fps: float,
        low: float,
        low_2: float,
        page: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
        **references: Any,
    ) -> AsyncIterator[tuple[Any, ...]]:
        values: tuple[Any, ...] = (prompt, negative, ref, revision, weight, scale, ref_2, revision_2, weight_2)
        values += (scale_2, size, steps, guidance, sampler, clip_skip, num_images, recommended, seed, randomize)
        video = _video(references, browsed, num_frames, fps, ((ref, low), (ref_2, low_2)))
        form = _form((*values, source, strength, browsed, kept), references, (low, low_2))
        with user_errors():
            # In a thread: the input image is read and decoded here, while the event loop serves other clients.
            built = await asyncio.to_thread(_request, handlers, form, video)
        # An async generator: it yields previews as the engine denoises, and ticks while it waits so that Gradio,
        # which checks the client after each yield, closes it when the browser went away (which cancels the
        # generation, queued or running). Without a LoRA the browsed base's pool generates; a LoRA runs on the
        # base it was made for.
        on_base = pool_ui.request_base(handlers, browsed, bool(built.loras))
        skip = (gr.skip(),) * 8
        # An image run makes a strength's share of the steps, as its pipeline rounds it: the progress bar has the
        # engine's count, the preview line no total of its own.
        total = int(steps) if built.image is None else None
        async for item in generate(handlers, built, progress, transport="ui", base=on_base):
            if isinstance(item, Frame):
                yield video_ui.preview(item.image, built), fmt.preview_html(item.step, total), *skip
            elif item is None:
                yield (gr.skip(),) * 2 + skip
            else:
                yield await _shown(handlers, form, item, page)

    return generate_ui


def _video(named: dict[str, Any], *form: Any) -> tuple[Any, ...]:
    """What `video_ui.video_request` reads after the form's part (`form`): the reference video and its settings,
    taken out of the values handed over by name (`named`, which keeps the reference images')."""
    settings = tuple(named.pop(name, None) for name in video_ui.IN_CONTEXT)
    return (*form, named.pop(CLIP, None), settings)


def _request(handlers: Handlers, form: dict[str, Any], video: tuple[Any, ...]) -> GenerateRequest:
    """The form's request (its images read and decoded), with what a video pool reads beside it (`video`:
    `video_ui.video_request`'s browsed base, frames, rate, low-noise scales and reference video, read as far as its
    header, and that video's settings)."""
    built = history_ui.request_of(form, handlers.settings.max_input_pixels)
    return video_ui.video_request(handlers, built, *video)


def _form(values: tuple[Any, ...], named: dict[str, Any], lows: tuple[float, float]) -> dict[str, Any]:
    """The Generate event's form by name (`FORM`), with its reference images (Image 2 first) and each LoRA's
    range (`WINDOW`), both handed over by name (`named`), and each LoRA's low-noise scale (`lora_scale_2`,
    `lora_2_scale_2`: the share link's names)."""
    named = dict(named)
    windows = {name: named.pop(name, None) for name in WINDOW}
    form = dict(zip(FORM, values, strict=True)) | windows
    form["references"] = _in_order(named)
    form["lora_scale_2"], form["lora_2_scale_2"] = lows
    return form


async def _shown(handlers: Handlers, form: dict[str, Any], item: GenerateResult, page: gr.Request) -> tuple[Any, ...]:
    """A result's outputs: image, info, seed, status, gallery, share link, history and its state, a video."""
    share, shown, now = history_ui.remember(form, item, base_url(dict(page.headers)))
    several = len(item.images) > 1
    gallery = gr.Gallery(value=history_ui.cells(item) if several else None, visible=several)
    status = await pool_ui.status(handlers)
    info = fmt.result_html(item) + mode_html(item)
    # A video's MP4 is written off the event loop (seconds for a long clip).
    video = await asyncio.to_thread(video_ui.video_result, item)
    # A video takes the image's place again once it is there (the previews showed in the image).
    image = gr.Image(item.image, visible=False) if item.is_video else item.image
    return image, info, item.seed, status, gallery, share, shown, now, gr.skip(), video


def wire_compare(handlers: Handlers, request: RequestPanel, comparison: ComparePanel, status_md: gr.Markdown) -> None:
    compare_ui = _compare_ui(handlers)
    comparison.run.click(
        compare_ui,
        [
            request.prompt,
            request.negative,
            comparison.loras,
            comparison.scales,
            comparison.starts,
            comparison.ends,
            comparison.include_base,
            request.size,
            request.steps,
            request.guidance,
            request.seed,
            request.randomize,
            request.sampler,
            request.clip_skip,
            request.source.editor,
            request.source.strength,
        ],
        [comparison.grid, comparison.cells, comparison.info, request.seed, status_md],
        concurrency_id=PIPELINE,
        # As for generations: the engine's scheduler is the one queue (a queued comparison holds no thread).
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress_on=comparison.grid,
        inputs_kwargs=_slots(request),
    )


def _compare_ui(handlers: Handlers) -> Callable[..., Any]:
    """The Compare button's handler: the form's settings for every cell (and the input image, when there is one)."""

    async def compare_ui(
        prompt: str,
        negative: str,
        loras: str,
        scales: str,
        starts: str,
        ends: str,
        include_base: bool,
        size: str,
        steps: float,
        guidance: float,
        seed: float | None,
        randomize: bool,
        sampler: str,
        clip_skip: float,
        source: dict | None,
        strength: float | None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
        **references: Any,
    ) -> tuple[Any, ...]:
        with user_errors():
            width, height = fmt.parse_size(size)
            # Every cell starts from the input image, when there is one (as Generate does).
            starting = await asyncio.to_thread(_starting, source, strength, _in_order(references), handlers)
            built = comparison_fields.compare_request(
                prompt,
                negative,
                loras,
                scales,
                bool(include_base),
                int(steps),
                float(guidance),
                width,
                height,
                fmt.seed_value(seed, randomize),
                sampler,
                int(clip_skip or 1) - 1,
                starting,
                # Each LoRA's window, read as /compare's `starts`/`ends` are (one parser, one message).
                starts,
                ends,
            )
        done = await compare(handlers, built, progress)
        result = done.result
        cells = [(r.image, label) for label, r in zip(result.labels, result.results, strict=True)]
        return done.grid, cells, comparison_fields.compare_html(result), result.seed, await pool_ui.status(handlers)

    return compare_ui


def _starting(source: dict | None, strength: float | None, slots: list[Any], handlers: Handlers) -> dict[str, Any]:
    """The input image, its mask, the strength and the reference images every cell of a comparison starts from."""
    pixels = handlers.settings.max_input_pixels
    image, mask = source_images(source, pixels)
    images = references_of(slots, pixels, first=image is not None)
    return {"image": image, "mask_image": mask, "strength": strength if image is not None else None, "images": images}


def wire_status(demo: gr.Blocks, handlers: Handlers, status_md: gr.Markdown, refresh: gr.Button, api_md: Any) -> None:
    """The status panel (on load and on refresh) and the API panel's examples for the URL the page came from."""

    async def status() -> str:
        return await pool_ui.status(handlers)

    # Gradio hands the request only to a function whose own signature asks for it (not through a partial).
    def snippets(request: gr.Request) -> str:
        return pool_ui.snippets(handlers, base_url(dict(request.headers)))

    demo.load(status, None, status_md, api_visibility=PRIVATE, queue=False)
    refresh.click(status, None, status_md, api_visibility=PRIVATE, queue=False)
    demo.load(snippets, None, api_md, api_visibility=PRIVATE, queue=False)
