"""The named API `gradio_client` sees (/generate, /generate_images, /compare, /catalog, /lora_info, /pool_status;
/generate_video is `serving.ui.video_api`'s), and the generation both they and the UI run (`generate`, `compare`).

Each endpoint hangs off a hidden trigger with hidden inputs, so the API has exactly the parameters named here;
it calls the one shared handler (`serving.handlers`) the UI calls too and answers JSON; errors become `gr.Error`
(`serving.errors`). `/generate` yields previews, then the final image. New parameters default to what the
endpoint did before they existed. Details: docs/internals.md, "serving/ui/gradio_api.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import gradio as gr

from engine.pools.scheduler import QueueView
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from serving.errors import user_errors
from serving.handlers import Comparison, Handlers
from serving.streaming import Frame
from serving.ui import comparison as comparison_fields
from serving.ui import formatting as fmt
from serving.ui import pool_views
from serving.ui.api_requests import LATE, api_request, starting_fields, windowed
from serving.ui.liveness import client_gone, until_gone
from serving.ui.progress import CellProgress, StepProgress
from serving.ui.uploads import uploaded_path

__all__ = [
    "BROWSE",
    "CHECK",
    "PIPELINE",
    "add_api_endpoints",
    "compare",
    "generate",
]

# UI and API generation share this group; the engine's scheduler is their one queue (one at a time on the pipeline).
PIPELINE = "pipeline"
BROWSE = "catalog"
CHECK = "lora_check"


async def generate(
    handlers: Handlers, request: GenerateRequest, progress: gr.Progress, transport: str = "gradio_api", base: str = ""
) -> AsyncIterator[Frame | GenerateResult | None]:
    """Generate for the UI (`transport="ui"`) or the API: wait on the engine's scheduler (the one queue, no
    thread held) showing the place it gives, then preview frames as it denoises, then the result; `None`
    ticks while nothing new comes. Closing it, or the client going away while it waits (`serving.ui.liveness`:
    the API yields no ticks, so Gradio would not tell it), cancels the generation."""

    def on_queue(view: QueueView) -> None:
        progress(0, desc=fmt.queue_text(view))

    gone = client_gone()
    progress(0, desc="Preparing LoRAs (download, convert)")
    with user_errors():
        stream = handlers.generate_stream(
            request, StepProgress(progress), on_queue=on_queue, transport=transport, base=base
        )
        async with aclosing(stream):
            async for item in stream:
                if item is None and gone():
                    # Closing the stream cancels the generation: it leaves the queue, or stops at its next step.
                    return
                yield item


async def compare(handlers: Handlers, request: Any, progress: gr.Progress, base: str = "") -> Comparison:
    """A comparison grid for the UI or the API (one queue turn for all its cells, awaited without a thread); a
    client that goes away cancels it (`serving.ui.liveness`)."""

    def on_queue(view: QueueView) -> None:
        progress(0, desc=fmt.queue_text(view))

    gone = client_gone()
    progress(0, desc="Preparing LoRAs (download, convert)")
    with user_errors():
        return await until_gone(handlers.compare(request, CellProgress(progress), base, on_queue), gone)


def add_api_endpoints(handlers: Handlers) -> None:
    """The named API for gradio_client: hidden inputs; each parameter is named after the function's argument."""
    defaults = handlers.default.defaults
    with gr.Column(visible=False):
        prompt, negative_prompt, lora, lora_2 = gr.Textbox(), gr.Textbox(""), gr.Textbox(""), gr.Textbox("")
        # No `precision`: Gradio would round 2.5 steps (and True) quietly; the engine refuses them by name.
        lora_scale, lora_2_scale = gr.Number(1.0), gr.Number(1.0)
        steps, guidance = gr.Number(defaults.steps), gr.Number(defaults.guidance)
        width, height = gr.Number(defaults.side), gr.Number(defaults.side)
        seed, page = gr.Number(-1), gr.Number(0, precision=0)
        base, search, sort = gr.Textbox(""), gr.Textbox(""), gr.Textbox("downloads")
        source = gr.Textbox("hub")
        repo_id, revision, weight_name = gr.Textbox(), gr.Textbox(""), gr.Textbox("")
        loras, scales, include_base = gr.Textbox(""), gr.Textbox(""), gr.Checkbox(False)
        # "" and 0: the pool's own scheduler and no CLIP skip (or the LoRAs' recommendations), as before.
        scheduler, scheduler_options, clip_skip = gr.Textbox(""), gr.JSON(None), gr.Number(0)
        num_images = gr.Number(2)
        # Image-to-image: no image is text-to-image, as before; no strength is the pool's default.
        # Files, handed over as their paths unopened: `encoded_image` is the first to read them (PNG, JPEG and WebP
        # parsers only; the header judged against MAX_INPUT_PIXELS), and the engine's check decodes them. gr.Image
        # would have PIL open each first (and leave it open), with PIL's refusals; `handle_file` sends either alike.
        # `uploaded_path`: gr.File's filepath input without Gradio 6.31's stray empty temp file per upload.
        input_image, mask, strength = uploaded_path(), uploaded_path(), gr.Number(None)
        # Further reference images after `image` (none: as before), as file paths read the same way, once counted.
        references = uploaded_path(file_count="multiple")
        # Each LoRA's schedule window, last (`LATE`); None: from the first step to the last, as before.
        window = [gr.Number(None) for _ in LATE]
        image = gr.Image(type="pil", format="png", label="image")
        images = gr.Gallery(type="pil", format="png", label="images")
        grid = gr.Image(type="pil", format="png", label="grid")
        cells = gr.Gallery(type="pil", format="png", label="cells")
        info, page_json, lora_json = gr.JSON(label="info"), gr.JSON(label="page"), gr.JSON(label="lora")
        compare_json, status_json = gr.JSON(label="info"), gr.JSON(label="status")
        trigger = gr.Button()

    generation: list[Any] = [prompt, negative_prompt, lora, lora_scale, lora_2, lora_2_scale, steps, guidance]
    generation += [width, height, seed, base, scheduler, scheduler_options, clip_skip]
    comparing = [prompt, negative_prompt, loras, scales, include_base, steps, guidance, width, height, seed, base]
    comparing += [scheduler, clip_skip]
    starting = [input_image, mask, strength, references]
    outputs = ([image, info], [images, info], [grid, cells, compare_json])
    _wire_generation(handlers, trigger, (generation, num_images, comparing, starting, window), outputs)
    lookups = ([base, search, sort, page, source], page_json, status_json, [repo_id, revision, weight_name], lora_json)
    _wire_lookups(handlers, trigger, *lookups)


def _wire_generation(
    handlers: Handlers,
    trigger: gr.Button,
    inputs: tuple[list[Any], gr.Number, list[Any], list[Any], list[Any]],
    outputs: tuple[list[Any], list[Any], list[Any]],
) -> None:
    """The endpoints that generate: /generate, /generate_images and /compare (in that order), each taking the
    starting image, mask, strength and references, then (not /compare) each LoRA's schedule window last."""
    generation, num_images, comparing, starting, window = inputs
    for fn, arguments, answer, name in (
        (_generate_api(handlers), [*generation, *starting, *window], outputs[0], "generate"),
        (_generate_images_api(handlers), [*generation, num_images, *starting, *window], outputs[1], "generate_images"),
        (_compare_api(handlers), [*comparing, *starting], outputs[2], "compare"),
    ):
        # The engine's scheduler is the one queue (see app.py): Gradio does not hold generations back.
        trigger.click(fn, arguments, answer, api_name=name, concurrency_id=PIPELINE, concurrency_limit=None)


def _wire_lookups(
    handlers: Handlers,
    trigger: gr.Button,
    catalog_inputs: list[Any],
    page_json: gr.JSON,
    status_json: gr.JSON,
    lora_inputs: list[Any],
    lora_json: gr.JSON,
) -> None:
    """The endpoints that read without generating: /catalog, /pool_status, /lora_info (in that order)."""
    browsing, checking = (
        {"concurrency_id": BROWSE, "concurrency_limit": 4},
        {"concurrency_id": CHECK, "concurrency_limit": 2},
    )
    trigger.click(_catalog_api(handlers), catalog_inputs, page_json, api_name="catalog", **browsing)  # type: ignore[arg-type]
    trigger.click(_pool_status(handlers), None, status_json, api_name="pool_status", queue=False)
    trigger.click(_lora_info(handlers), lora_inputs, lora_json, api_name="lora_info", **checking)  # type: ignore[arg-type]


# Each endpoint's handler is made here: Gradio names its parameters and documents it from its signature and docstring.
def _generate_api(handlers: Handlers) -> Callable[..., Any]:
    async def generate_api(
        prompt: str,
        negative_prompt: str,
        lora: str,
        lora_scale: float,
        lora_2: str,
        lora_2_scale: float,
        steps: float | None,
        guidance: float | None,
        width: float | None,
        height: float | None,
        seed: float | None,
        base: str = "",
        scheduler: str = "",
        scheduler_options: dict | None = None,
        clip_skip: float | None = 0,
        image: Any = None,
        mask: Any = None,
        strength: float | None = None,
        images: list[Any] | None = None,
        lora_start: float | None = None,
        lora_end: float | None = None,
        lora_2_start: float | None = None,
        lora_2_end: float | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio hands out progress)
    ) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
        """Generate an image; `lora` and `lora_2` are Hub repo ids, Civitai references (`civitai:<version id>`, a
        civitai.com model page or download link, an AIR) or local: files ("" for none); seed -1 is random.

        The LoRAs pick the base model they were made for; without one, `base` names a served base ("" for the
        default). `scheduler`: a sampler ("DPM++ 2M Karras", "Euler a", "LCM", ...) or a diffusers scheduler class,
        "" for the LoRAs' recommendation or the model's own; `scheduler_options` e.g. {"use_karras_sigmas": true};
        `clip_skip`: text-encoder layers skipped as diffusers counts them (A1111's "Clip skip 2" is 1). `image`
        (none: text-to-image) is the image to start from, `mask` an inpainting mask (white repainted), `strength`
        how much of the image is re-noised (0-1; none: the model's default); `images` further reference images
        after `image` (a list of `handle_file`s: the prompt's "image 2", ...; none: only `image`). `lora_start` and
        `lora_end` (`lora_2_start`, `lora_2_end` for `lora_2`) are fractions of the steps (0-1): the LoRA runs at its
        scale on steps i with start <= i / steps < end, at 0 elsewhere (none: from the first step to the last).
        Yields previews while denoising (info `{"preview": true, "step": k}`), then the image and its info.
        """
        with user_errors():
            # In a thread: the files are read here (the event loop serves every other client meanwhile).
            settings = handlers.settings
            request = await asyncio.to_thread(
                api_request,
                prompt, negative_prompt, (lora, lora_scale, lora_2, lora_2_scale), steps, guidance, width, height,
                seed, scheduler, scheduler_options, clip_skip, 1,
                (image, mask, strength, images, settings.max_input_pixels, settings.max_reference_images),
            )  # fmt: skip
            request = windowed(request, ((lora, lora_start, lora_end), (lora_2, lora_2_start, lora_2_end)))
            # An image endpoint: a video pool is refused where the request is checked, before anything runs.
            request = dataclasses.replace(request, expects="image")
        async for item in generate(handlers, request, progress, base=(base or "").strip()):
            if isinstance(item, Frame):
                yield item.image, {"preview": True, "step": item.step}
            elif item is not None:  # ticks are for the UI's liveness check: the API shows frames and the result
                yield item.image, fmt.result_info(item)

    return generate_api


def _generate_images_api(handlers: Handlers) -> Callable[..., Any]:
    async def generate_images_api(
        prompt: str,
        negative_prompt: str,
        lora: str,
        lora_scale: float,
        lora_2: str,
        lora_2_scale: float,
        steps: float | None,
        guidance: float | None,
        width: float | None,
        height: float | None,
        seed: float | None,
        base: str = "",
        scheduler: str = "",
        scheduler_options: dict | None = None,
        clip_skip: float | None = 0,
        num_images: float | None = 2,
        image: Any = None,
        mask: Any = None,
        strength: float | None = None,
        images: list[Any] | None = None,
        lora_start: float | None = None,
        lora_end: float | None = None,
        lora_2_start: float | None = None,
        lora_2_end: float | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio hands out progress)
    ) -> tuple[list[tuple[Any, str]], dict[str, Any]]:
        """Several images (1 to 4) in one run, with consecutive seeds from `seed`: `[{"image": path, "caption":
        "seed N"}, ...]` and the info (`seeds` lists them; each is what /generate gives for that seed, within 2 levels).
        Arguments as /generate's (each LoRA's window too), with `num_images`."""
        with user_errors():
            # In a thread: the files are read here (the event loop serves every other client meanwhile).
            settings = handlers.settings
            request = await asyncio.to_thread(
                api_request,
                prompt, negative_prompt, (lora, lora_scale, lora_2, lora_2_scale), steps, guidance, width, height,
                seed, scheduler, scheduler_options, clip_skip, num_images,
                (image, mask, strength, images, settings.max_input_pixels, settings.max_reference_images),
            )  # fmt: skip
            request = windowed(request, ((lora, lora_start, lora_end), (lora_2, lora_2_start, lora_2_end)))
            # An image endpoint: a video pool is refused where the request is checked, before anything runs.
            request = dataclasses.replace(request, expects="image")
        result: GenerateResult | None = None
        async for item in generate(handlers, request, progress, base=(base or "").strip()):
            if isinstance(item, GenerateResult):
                result = item
        assert result is not None  # the stream ends with the result, or raises
        gallery = [(image, f"seed {seed}") for image, seed in zip(result.images, result.seeds, strict=True)]
        return gallery, fmt.result_info(result)

    return generate_images_api


def _compare_api(handlers: Handlers) -> Callable[..., Any]:
    async def compare_api(
        prompt: str,
        negative_prompt: str,
        loras: str,
        scales: str,
        include_base: bool,
        steps: float | None,
        guidance: float | None,
        width: float | None,
        height: float | None,
        seed: float | None,
        base: str = "",
        scheduler: str = "",
        clip_skip: float | None = 0,
        image: Any = None,
        mask: Any = None,
        strength: float | None = None,
        images: list[Any] | None = None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio hands out progress)
    ) -> tuple[Any, list[tuple[Any, str]], dict[str, Any]]:
        """Compare LoRAs on one prompt and seed: a labelled grid image, the cells, and their info.

        `loras`: up to 4 LoRAs, one per line or comma-separated; `scales`: "" (each at 1), one scale for all,
        one per LoRA, or several for a single LoRA (a sweep, e.g. "0, 0.5, 1"); `include_base` puts the base
        model's image first. Each cell is what /generate returns for the same inputs (`scheduler` and `clip_skip` as
        there, shared by every cell). The LoRAs must share one base model, on which the grid runs (`base` names it
        when the LoRAs declare none, "" for the default). `image`, `mask` and `strength` as /generate's: every cell
        starts from the same image (none: text-to-image).
        """
        with user_errors():
            settings = handlers.settings
            starting = await asyncio.to_thread(
                starting_fields, image, mask, strength, images, settings.max_input_pixels, settings.max_reference_images
            )
            request = comparison_fields.compare_request(
                prompt, negative_prompt, loras, scales, include_base, steps, guidance, width, height, seed,
                scheduler, clip_skip, starting,
            )  # fmt: skip
        comparison = await compare(handlers, request, progress, (base or "").strip())
        result = comparison.result
        gallery = [(r.image, label) for label, r in zip(result.labels, result.results, strict=True)]
        return comparison.grid, gallery, comparison_fields.compare_info(result)

    return compare_api


def _catalog_api(handlers: Handlers) -> Callable[..., Any]:
    def catalog_api(base: str, search: str, sort: str, page: int | None, source: str = "hub") -> dict[str, Any]:
        """One page of LoRAs for a base model ("" for the served one), and how fresh the list is; `source` is
        "hub" or "civitai" (Civitai's LoRAs that run on that base's pool)."""
        with user_errors():
            return fmt.catalog_json(handlers.page(base, search, sort, page or 0, source or "hub"))

    return catalog_api


def _lora_info(handlers: Handlers) -> Callable[..., Any]:
    async def lora_info(repo_id: str, revision: str, weight_name: str) -> dict[str, Any]:
        """What a LoRA is (its catalogue entry: trigger words, and for a Civitai LoRA its page, recommended scale
        and CLIP skip) and whether it loads here (rank, size, layers, warnings); `repo_id` may be a Civitai
        reference too."""
        with user_errors():
            spec = fmt.lora_spec(repo_id, 1.0, revision, weight_name) or LoraSpec(repo_id or "")
            report = await handlers.lora(spec)
        return {"entry": report.entry.to_json(), "check": fmt.check_info(report.check)}

    return lora_info


def _pool_status(handlers: Handlers) -> Callable[..., Any]:
    async def pool_status() -> dict[str, Any]:
        """Each pool's base, family, request defaults and the inputs it reads, memory (on the device or waiting in
        host RAM; null on a cluster) and engine status."""
        with user_errors():
            return pool_views.pools_status_json(await handlers.status(), handlers.pools)

    return pool_status
