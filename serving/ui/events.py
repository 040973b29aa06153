"""The UI's events: what each click, selection and submit calls (the shared handlers) and shows (formatting).

`app.build_demo` lays the panels out and hands them here. Generations and comparisons wait on the backend's
one queue (no Gradio concurrency limit, no thread held while queued); catalogue pages and LoRA checks use
small Gradio concurrency groups of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from engine.errors import SwitchboardError
from engine.requests import GenerateRequest
from lora_catalog.entries import LoraEntry
from serving.errors import user_errors
from serving.handlers import PAGE_SIZE, Handlers
from serving.streaming import Frame
from serving.ui import comparison as comparison_fields
from serving.ui import formatting as fmt
from serving.ui import pools as pool_ui
from serving.ui.gradio_api import BROWSE, CHECK, PIPELINE, compare, generate
from serving.ui.panels import Browser, ComparePanel, RequestPanel

__all__ = ["PRIVATE", "wire_browsing", "wire_compare", "wire_generation", "wire_status"]

# Events of the UI itself: not part of the named API that gradio_client sees.
PRIVATE = "private"


def wire_browsing(
    demo: gr.Blocks,
    handlers: Handlers,
    browser: Browser,
    request: RequestPanel,
    comparison: ComparePanel,
    state: tuple[gr.State, gr.State, gr.State],
    hub_url: str,
) -> None:
    entries, page, inserted = state
    placeholder = fmt.placeholder_image()
    first, second = request.first, request.second

    def browse(base: str, search: str, sort: str, source: str, number: int) -> tuple[Any, ...]:
        with user_errors():
            result = handlers.page(base, search, sort, max(0, int(number)), source)
        items = [(e.preview_urls[0] if e.preview_urls else placeholder, e.title) for e in result.entries]
        shown = f"{result.page * PAGE_SIZE + 1}–{result.page * PAGE_SIZE + len(result.entries)}"
        label = f"{shown} of {result.total_known}" if result.entries else "no LoRAs found"
        # A local-only catalogue is offline by design; the warning sign is for a Hub list gone stale.
        stale = result.freshness.offline and result.freshness.source != "local"
        note = ("⚠ " if stale else "") + result.freshness.message
        return (
            gr.Gallery(value=items, selected_index=None),
            [e.to_json() for e in result.entries],
            result.page,
            f"{label} · {note}",
            gr.Button(interactive=result.page > 0),
            gr.Button(interactive=result.has_more),
        )

    def select(
        shown: list[dict], slot: str, prompt: str, triggers: dict, listed: str, evt: gr.SelectData
    ) -> tuple[Any, ...]:
        entry = LoraEntry.from_json(shown[evt.index])
        # Its pool's size presets and defaults follow; a LoRA of a base no pool serves says so on its card.
        warning, *controls = pool_ui.entry_controls(handlers, entry)
        card = fmt.entry_card(entry, hub_url) + warning
        if slot == "Compare":
            # The list takes the LoRA only: one prompt serves every cell, so no trigger word goes in.
            lines = [line for line in (listed or "").splitlines() if line.strip()]
            added = lines if entry.ref in (line.strip() for line in lines) else [*lines, entry.ref]
            # Card, readiness badge, the six LoRA fields, prompt, triggers: all kept; the list grows.
            return (card, *(gr.skip() for _ in range(9)), "\n".join(added), *controls)
        trigger = entry.trigger_words[0] if entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, triggers.get(slot), trigger)
        fields = (entry.ref, "", entry.weight_name if entry.source == "hub" else "")
        is_second = slot == "LoRA 2"
        return (
            card,
            fmt.readiness_html(entry.ref, "preparing"),
            *(gr.skip() if is_second else value for value in fields),
            *(value if is_second else gr.skip() for value in fields),
            new_prompt,
            {**triggers, slot: trigger},
            gr.skip(),
            *controls,
        )

    async def prefetch(slot: str, *fields: str) -> str:
        """Prepare the LoRA just selected, so that Generate finds it in the cache; the badge says when."""
        if slot not in ("LoRA 1", "LoRA 2"):
            return ""  # a comparison prepares its LoRAs when it runs
        ref, revision, weight = fields[3:] if slot == "LoRA 2" else fields[:3]
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return ""
        try:
            await handlers.prefetch(spec)
        except SwitchboardError as e:
            return fmt.readiness_html(spec.ref, "failed", str(e))
        return fmt.readiness_html(spec.ref, "ready")

    async def check(slot: str, ref: str, revision: str, weight: str, prompt: str, triggers: dict) -> tuple[Any, ...]:
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return (
                fmt.error_card("Type a Hub repo id (owner/name), a Civitai link or a local: file first."),
                prompt,
                triggers,
            )
        try:
            report = await handlers.lora(spec)
        except SwitchboardError as e:
            return fmt.error_card(str(e)), prompt, triggers
        trigger = report.entry.trigger_words[0] if report.entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, triggers.get(slot), trigger)
        return fmt.entry_card(report.entry, hub_url, report.check), new_prompt, {**triggers, slot: trigger}

    filters = [browser.base, browser.search, browser.sort, browser.source]
    outputs = [browser.gallery, entries, page, browser.page_info, browser.previous, browser.next]
    opts: dict[str, Any] = {"concurrency_id": BROWSE, "concurrency_limit": 4, "api_visibility": PRIVATE}
    demo.load(lambda b, s, o, src: browse(b, s, o, src, 0), filters, outputs, **opts)
    gr.on(
        [browser.base.change, browser.sort.change, browser.search.submit, browser.source.change],
        lambda b, s, o, src: browse(b, s, o, src, 0),
        filters,
        outputs,
        **opts,
    )
    browser.base.change(
        lambda b: pool_ui.on_base(handlers, b),
        browser.base,
        [browser.note, request.size, request.steps, request.guidance, request.negative],
        **opts,
    )
    browser.next.click(lambda b, s, o, src, n: browse(b, s, o, src, n + 1), [*filters, page], outputs, **opts)
    browser.previous.click(
        lambda b, s, o, src, n: browse(b, s, o, src, max(0, n - 1)), [*filters, page], outputs, **opts
    )
    browser.gallery.select(
        select,
        [entries, request.slot, request.prompt, inserted, comparison.loras],
        [
            browser.details,
            browser.readiness,
            first.ref,
            first.revision,
            first.weight,
            second.ref,
            second.revision,
            second.weight,
            request.prompt,
            inserted,
            comparison.loras,
            request.size,
            request.steps,
            request.guidance,
            request.negative,
        ],
        **opts,
    ).then(
        prefetch,
        [request.slot, first.ref, first.revision, first.weight, second.ref, second.revision, second.weight],
        browser.readiness,
        # Waits on the scheduler's preparation pool, not on a thread of Gradio's.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress="hidden",
    )
    check_opts: dict[str, Any] = {"concurrency_id": CHECK, "concurrency_limit": 2, "api_visibility": PRIVATE}
    check_outputs = [browser.details, request.prompt, inserted]

    # Gradio awaits a handler only when it is a coroutine function itself.
    async def check_first(ref: str, revision: str, weight: str, prompt: str, triggers: dict) -> tuple[Any, ...]:
        return await check("LoRA 1", ref, revision, weight, prompt, triggers)

    async def check_second(ref: str, revision: str, weight: str, prompt: str, triggers: dict) -> tuple[Any, ...]:
        return await check("LoRA 2", ref, revision, weight, prompt, triggers)

    for handler, lora in ((check_first, first), (check_second, second)):
        lora.check.click(
            handler, [lora.ref, lora.revision, lora.weight, request.prompt, inserted], check_outputs, **check_opts
        )


def wire_generation(
    handlers: Handlers,
    request: RequestPanel,
    base: gr.Dropdown,
    image: gr.Image,
    info: gr.HTML,
    status_md: gr.Markdown,
) -> None:
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
        seed: float | None,
        randomize: bool,
        browsed: str,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> AsyncIterator[tuple[Any, ...]]:
        with user_errors():
            width, height = fmt.parse_size(size)
            specs = (fmt.lora_spec(ref, scale, revision, weight), fmt.lora_spec(ref_2, scale_2, revision_2, weight_2))
            built = GenerateRequest(
                prompt=prompt,
                negative_prompt=negative,
                loras=tuple(s for s in specs if s is not None),
                steps=int(steps),
                guidance=float(guidance),
                width=width,
                height=height,
                seed=fmt.seed_value(seed, randomize),
            )
        # An async generator: it yields previews as the engine denoises, and ticks while it waits so that
        # Gradio, which checks the client after each yield, closes it when the browser went away (which cancels
        # the generation, queued or running).
        # Without a LoRA the browsed base's pool generates; a LoRA runs on the base it was made for.
        on_base = pool_ui.request_base(handlers, browsed, bool(built.loras))
        async for item in generate(handlers, built, progress, transport="ui", base=on_base):
            if isinstance(item, Frame):
                yield item.image, fmt.preview_html(item.step, int(steps)), gr.skip(), gr.skip()
            elif item is None:
                yield (gr.skip(),) * 4
            else:
                yield item.image, fmt.result_html(item), item.seed, await pool_ui.status(handlers)

    slots = [
        getattr(lora, field) for lora in (request.first, request.second) for field in ("ref", "revision", "weight")
    ]
    inputs = [
        request.prompt,
        request.negative,
        *slots[:3],
        request.first.scale,
        *slots[3:],
        request.second.scale,
        request.size,
        request.steps,
        request.guidance,
        request.seed,
        request.randomize,
        base,
    ]
    gr.on(
        [request.run.click, request.prompt.submit],
        generate_ui,
        inputs,
        [image, info, request.seed, status_md],
        concurrency_id=PIPELINE,
        # The scheduler is the one queue and limit for every transport: Gradio hands generations over at once
        # (they wait on the scheduler, holding no thread), rather than keeping a second queue.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress_on=image,
    )


def wire_compare(handlers: Handlers, request: RequestPanel, comparison: ComparePanel, status_md: gr.Markdown) -> None:
    async def compare_ui(
        prompt: str,
        negative: str,
        loras: str,
        scales: str,
        include_base: bool,
        size: str,
        steps: float,
        guidance: float,
        seed: float | None,
        randomize: bool,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> tuple[Any, ...]:
        with user_errors():
            width, height = fmt.parse_size(size)
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
            )
        done = await compare(handlers, built, progress)
        result = done.result
        cells = [(r.image, label) for label, r in zip(result.labels, result.results, strict=True)]
        return done.grid, cells, comparison_fields.compare_html(result), result.seed, await pool_ui.status(handlers)

    comparison.run.click(
        compare_ui,
        [
            request.prompt,
            request.negative,
            comparison.loras,
            comparison.scales,
            comparison.include_base,
            request.size,
            request.steps,
            request.guidance,
            request.seed,
            request.randomize,
        ],
        [comparison.grid, comparison.cells, comparison.info, request.seed, status_md],
        concurrency_id=PIPELINE,
        # As for generations: the engine's scheduler is the one queue (a queued comparison holds no thread).
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress_on=comparison.grid,
    )


def wire_status(demo: gr.Blocks, handlers: Handlers, status_md: gr.Markdown, refresh: gr.Button, api_md: Any) -> None:
    """The status panel (on load and on refresh) and the API panel's examples for the URL the page came from."""

    async def status() -> str:
        return await pool_ui.status(handlers)

    # Gradio hands the request only to a function whose own signature asks for it (not through a partial).
    def snippets(request: gr.Request) -> str:
        return pool_ui.snippets(handlers, fmt.base_url(dict(request.headers)))

    demo.load(status, None, status_md, api_visibility=PRIVATE, queue=False)
    refresh.click(status, None, status_md, api_visibility=PRIVATE, queue=False)
    demo.load(snippets, None, api_md, api_visibility=PRIVATE, queue=False)
