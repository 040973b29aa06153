"""The UI's form as a request, and what the session keeps of each result: its history and its share link.

The form's values (`FORM`, in the order the Generate event takes them) make the request (`request_of`). After
each result the session remembers them as link parameters (`serving.ui.session.share_params`) with a thumbnail,
newest first; "use these settings again" puts an entry's back into the form, and a page opened with such
parameters in its URL starts with them (`wire_session`), both through `serving.ui.session.form_values`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from engine.requests import GenerateRequest, GenerateResult
from serving.handlers import Handlers
from serving.recipes import VideoReference, image_hash
from serving.ui import formatting as fmt
from serving.ui import pool_views, session
from serving.ui.api_requests import windowed
from serving.ui.inputs import source_images
from serving.ui.panels import Browser, RequestPanel, ResultPanel
from serving.ui.references import references_of
from serving.video import frame_count

__all__ = ["FORM", "WINDOW", "cells", "remember", "request_of", "wire_session"]

PRIVATE = "private"
# The Generate event's inputs, by name (the link parameters' names where they have one).
FORM = (
    "prompt",
    "negative",
    "lora",
    "lora_revision",
    "lora_weight",
    "lora_scale",
    "lora_2",
    "lora_2_revision",
    "lora_2_weight",
    "lora_2_scale",
    "size",
    "steps",
    "guidance",
    "sampler",
    "clip_skip",
    "images",
    "recommended",
    "seed",
    "randomize",
    "source",
    "strength",
    "base",
    "history",
)
# Each LoRA's "active from … to …" range beside the form (fractions of the steps; the link parameters' names).
WINDOW = session.WINDOWS


def request_of(form: Mapping[str, Any], max_pixels: int) -> GenerateRequest:
    """The request the form asks for (its input image and reference images, `references`: Image 2 first, read
    within `max_pixels`: MAX_INPUT_PIXELS). With the
    switch on, what the form leaves at its default (the sampler, CLIP skip 1) stays unset, so a LoRA's own
    recommendation (even one only its file's metadata holds) applies."""
    width, height = fmt.parse_size(form["size"])
    specs = (
        fmt.lora_spec(form["lora"], form["lora_scale"], form["lora_revision"], form["lora_weight"]),
        fmt.lora_spec(form["lora_2"], form["lora_2_scale"], form["lora_2_revision"], form["lora_2_weight"]),
    )
    on = bool(form["recommended"])
    skip = int(form["clip_skip"] or 1) - 1
    # The input image and the mask painted on it (none: text-to-image, where the strength does not apply).
    image, mask = source_images(form["source"], max_pixels)
    strength = form["strength"] if image is not None else None
    images = references_of(form.get("references") or (), max_pixels, first=image is not None)
    request = GenerateRequest(
        prompt=form["prompt"],
        negative_prompt=form["negative"],
        loras=tuple(s for s in specs if s is not None),
        steps=int(form["steps"]),
        guidance=float(form["guidance"]),
        width=width,
        height=height,
        seed=fmt.seed_value(form["seed"], form["randomize"]),
        scheduler=form["sampler"] or None,
        clip_skip=skip if skip or not on else None,
        num_images=int(form["images"] or 1),
        lora_defaults=on,
        image=image,
        mask_image=mask,
        strength=None if strength is None else float(strength),
        images=images,
    )
    # The form sends both slots' ranges: an empty slot's is its controls' leftover state, not a schedule asked for
    # (an API client's, sent only when given, is refused: `windowed`).
    ranges = [
        (form[ref], *session.window(form, ref)) if (form[ref] or "").strip() else (None, None, None)
        for ref in ("lora", "lora_2")
    ]
    return windowed(request, ranges)


def cells(result: GenerateResult) -> list[tuple[Any, str]]:
    """A request for several images, as the gallery shows it: each image with its seed."""
    return [(image, f"seed {seed}") for image, seed in zip(result.images, result.seeds, strict=True)]


def remember(form: Mapping[str, Any], result: GenerateResult, base_url: str) -> tuple[str, list, list]:
    """The result's share link, and the session's history with it first: (link, gallery items, entries)."""
    values = dict(form)
    values["seed"] = result.seed
    values["sampler"] = form["sampler"] or ""
    values["images"] = int(form["images"] or 1)
    values["clip_skip"] = int(form["clip_skip"] or 1)
    request = result.request
    # A link cannot carry the input image: it says one was used (and the strength it ran at).
    started = request.image is not None
    values["strength"] = request.strength if started else None
    values["input"] = result.mode if started else None
    # Nor further reference images: which they were (as the recipe's "Reference hashes"), image 1 first.
    shown = (request.image, *request.images) if started and request.images else ()
    values["references"] = ",".join(image_hash(image) for image in shown if image is not None) or None
    # Nor an IC-LoRA's reference video: its file's SHA-256 (as the recipe's "Reference video").
    video = request.reference_video
    values["reference_video"] = (VideoReference.of(video).sha256 or None) if video is not None else None
    # And the settings it ran with (the checked request's, as the recipe writes them): the same file needs them.
    ran = video is not None
    values["reference_strength"] = request.reference_strength if ran else None
    values["reference_downscale"] = request.reference_downscale if ran else None
    # A video's frames and rate, as it ran (the pool's defaults filled in).
    values["num_frames"] = frame_count(result) if result.is_video else None
    values["fps"] = result.fps if result.is_video else None
    # A two-stage pool's low-noise scales as the form had them (for each LoRA it named).
    two_stage = request.guidance_2 is not None
    for ref, low in (("lora", "lora_scale_2"), ("lora_2", "lora_2_scale_2")):
        values[low] = form.get(low) if two_stage and (form.get(ref) or "").strip() else None
    # Each named LoRA's range where it is not every step.
    for ref in ("lora", "lora_2"):
        named = (form.get(ref) or "").strip()
        values[f"{ref}_start"], values[f"{ref}_end"] = session.window(form, ref) if named else (None, None)
    params = session.share_params(values)
    mode = f" · {result.mode}" if started or result.is_video else ""
    caption = f"{result.seed} · {request.sampler} · {request.steps} steps{mode} · {request.prompt[:40]}"
    entries = [session.history_entry(params, result.image, caption), *(form["history"] or [])]
    entries = entries[: session.HISTORY_SIZE]
    return session.share_url(base_url, params), [(e["thumb"], e["caption"]) for e in entries], entries


def wire_session(
    demo: gr.Blocks,
    handlers: Handlers,
    browser: Browser,
    request: RequestPanel,
    result: ResultPanel,
    states: tuple[gr.State, gr.State],
) -> None:
    """The share link read on load, and "use these settings again" for a history entry.

    A new base in the filter resets the form's size, steps, guidance, sampler and CLIP skip to its pool's
    (`serving.ui.browsing`); when a link or an entry names a base, its values for those wait in `pending` for
    that change to apply instead.
    """
    history, pending = states
    fields = _session_fields(browser, request)
    assert len(fields) == len(session.FIELDS) + 1
    chosen = gr.State(None)
    # And whether each low-noise scale keeps the value set or follows its LoRA's scale (`video_ui.follow_scale`).
    outputs = [*fields, pending, request.first.low_moved, request.second.low_moved]

    controls = slice(session.FIELDS.index("size"), session.FIELDS.index("images"))
    video = slice(session.FIELDS.index("num_frames"), session.FIELDS.index("fps") + 1)

    def values(params: Mapping[str, str], browsed: str) -> tuple[Any, ...]:
        base = params.get("base") or ""
        pool = pool_views.pool_for_base(handlers.pools, base) if base else None
        filled = session.form_values(params, (pool or handlers.default).defaults, handlers.settings.max_steps)
        waiting = None
        if pool is not None and base != browsed:
            # The filter's change would reset these to the pool's defaults: it applies them instead.
            waiting = {"base": base, "controls": list(filled[controls]), "video": list(filled[video])}
        return (*filled, waiting, *session.low_noise_moved(params))

    def opened(browsed: str, page: gr.Request) -> tuple[Any, ...]:
        params = dict(page.query_params) if page is not None else {}
        if not any(name in params for name in session.FIELDS):
            return (gr.skip(),) * len(outputs)
        return values(params, browsed)

    def pick(evt: gr.SelectData) -> tuple[Any, Any]:
        return evt.index, gr.Button(interactive=True)

    def again(entries: list, index: int | None, browsed: str) -> tuple[Any, ...]:
        if index is None or not 0 <= index < len(entries or []):
            return (gr.skip(),) * len(outputs)
        return values(entries[index]["params"], browsed)

    options: dict[str, Any] = {"api_visibility": PRIVATE, "queue": False}
    demo.load(opened, browser.base, outputs, **options)
    result.history.select(pick, None, [chosen, result.use_again], **options)
    result.use_again.click(again, [history, chosen, browser.base], outputs, **options)


def _session_fields(browser: Browser, request: RequestPanel) -> list[Any]:
    """The form's fields a share link or a history entry fills (`session.FIELDS`), and the Randomize box."""
    first, second = request.first, request.second
    return [
        request.prompt,
        request.negative,
        first.ref,
        first.scale,
        first.revision,
        first.weight,
        second.ref,
        second.scale,
        second.revision,
        second.weight,
        request.size,
        request.steps,
        request.guidance,
        request.sampler,
        request.clip_skip,
        request.num_images,
        request.seed,
        request.source.strength,
        request.source.shared,
        browser.base,
        request.video.frames,
        request.video.fps,
        first.low,
        second.low,
        first.start,
        first.end,
        second.start,
        second.end,
        *request.video.settings,
        request.randomize,
    ]
