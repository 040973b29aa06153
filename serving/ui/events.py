"""The UI's events: what each click, selection and submit calls (the shared handlers) and shows (formatting).

`app.build_demo` lays the panels out and hands them here. Generations and comparisons wait on the backend's
one queue (no Gradio concurrency limit, no thread held while queued); catalogue pages and LoRA checks use
small Gradio concurrency groups of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from engine.errors import SwitchboardError
from lora_catalog.entries import LoraEntry
from serving.errors import user_errors
from serving.handlers import PAGE_SIZE, Handlers
from serving.streaming import Frame
from serving.ui import comparison as comparison_fields
from serving.ui import formatting as fmt
from serving.ui import history as history_ui
from serving.ui import pools as pool_ui
from serving.ui.gradio_api import BROWSE, CHECK, PIPELINE, compare, generate
from serving.ui.history import FORM
from serving.ui.panels import Browser, ComparePanel, RequestPanel, ResultPanel
from serving.ui.prefetches import SessionPrefetches
from serving.ui.snippets import base_url

__all__ = ["PRIVATE", "wire_browsing", "wire_compare", "wire_generation", "wire_status"]

# Events of the UI itself: not part of the named API that gradio_client sees.
PRIVATE = "private"


def wire_browsing(
    demo: gr.Blocks,
    handlers: Handlers,
    browser: Browser,
    request: RequestPanel,
    comparison: ComparePanel,
    state: tuple[gr.State, gr.State, gr.State, gr.State, gr.State],
    hub_url: str,
) -> None:
    entries, page, inserted, hinted, pending = state
    placeholder = fmt.placeholder_image()
    prefetches = SessionPrefetches()
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
        shown: list[dict], slot: str, prompt: str, triggers: dict, listed: str, hints: dict, evt: gr.SelectData
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
            return (card, *(gr.skip() for _ in range(9)), "\n".join(added), gr.skip(), *controls)
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
            pool_ui.with_hints(hints, slot, entry),
            *controls,
        )

    async def prefetch(
        slot: str,
        ref: str,
        revision: str,
        weight: str,
        ref_2: str,
        revision_2: str,
        weight_2: str,
        request: gr.Request,
    ) -> Any:
        """Prepare the LoRA just selected, so that Generate finds it in the cache; the badge says when. A newer
        pick for the same slot, or the session leaving, drops it (`serving.ui.prefetches`)."""
        if slot not in ("LoRA 1", "LoRA 2"):
            return ""  # a comparison prepares its LoRAs when it runs
        fields = (ref_2, revision_2, weight_2) if slot == "LoRA 2" else (ref, revision, weight)
        spec = fmt.lora_spec(fields[0], 1.0, fields[1], fields[2])
        if spec is None:
            return ""
        try:
            finished = await prefetches.run(request.session_hash or "", slot, handlers.prefetch(spec))
        except SwitchboardError as e:
            return fmt.readiness_html(spec.ref, "failed", str(e))
        # A dropped prefetch's badge is the newer pick's to set.
        return fmt.readiness_html(spec.ref, "ready") if finished else gr.skip()

    def leave(request: gr.Request) -> None:
        prefetches.leave(request.session_hash or "")

    async def check(
        slot: str, ref: str, revision: str, weight: str, prompt: str, triggers: dict, hints: dict
    ) -> tuple[Any, ...]:
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return (
                fmt.error_card("Type a Hub repo id (owner/name), a Civitai link or a local: file first."),
                prompt,
                triggers,
                hints,
            )
        try:
            report = await handlers.lora(spec)
        except SwitchboardError as e:
            return fmt.error_card(str(e)), prompt, triggers, hints
        trigger = report.entry.trigger_words[0] if report.entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, triggers.get(slot), trigger)
        card = fmt.entry_card(report.entry, hub_url, report.check)
        return card, new_prompt, {**triggers, slot: trigger}, pool_ui.with_hints(hints, slot, report.entry)

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
    # The controls that follow the pool; the negative prompt box last (only whether its model reads it).
    pool_controls = [
        request.size,
        request.steps,
        request.guidance,
        request.sampler,
        request.clip_skip,
        request.negative,
    ]
    recommend_outputs = [request.steps, request.guidance, request.sampler, request.clip_skip, request.note]

    def recommend(hints: dict, on: bool, slot: str) -> tuple[Any, ...]:
        if slot == "Compare":
            return (gr.skip(),) * len(recommend_outputs)
        return pool_ui.recommended(handlers, hints, bool(on))

    recommend_opts: dict[str, Any] = {"api_visibility": PRIVATE, "queue": False, "show_progress": "hidden"}

    def on_base(base: str, waiting: dict | None) -> tuple[Any, ...]:
        # A share link or a history entry that chose this base: its own values, not the pool's defaults.
        values = waiting["controls"] if isinstance(waiting, dict) and waiting.get("base") == base else None
        return (*pool_ui.on_base(handlers, base, values), None)

    browser.base.change(on_base, [browser.base, pending], [browser.note, *pool_controls, pending], **opts)
    request.recommended.change(
        recommend, [hinted, request.recommended, request.slot], recommend_outputs, **recommend_opts
    )
    browser.next.click(lambda b, s, o, src, n: browse(b, s, o, src, n + 1), [*filters, page], outputs, **opts)
    browser.previous.click(
        lambda b, s, o, src, n: browse(b, s, o, src, max(0, n - 1)), [*filters, page], outputs, **opts
    )
    selected = browser.gallery.select(
        select,
        [entries, request.slot, request.prompt, inserted, comparison.loras, hinted],
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
            hinted,
            *pool_controls,
        ],
        **opts,
    )
    selected.then(recommend, [hinted, request.recommended, request.slot], recommend_outputs, **recommend_opts)
    selected.then(
        prefetch,
        [request.slot, first.ref, first.revision, first.weight, second.ref, second.revision, second.weight],
        browser.readiness,
        # Waits in the pool's prefetch lane, not on a thread of Gradio's.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress="hidden",
    )
    demo.unload(leave)
    check_opts: dict[str, Any] = {"concurrency_id": CHECK, "concurrency_limit": 2, "api_visibility": PRIVATE}
    check_outputs = [browser.details, request.prompt, inserted, hinted]

    # Gradio awaits a handler only when it is a coroutine function itself.
    async def check_first(*fields: Any) -> tuple[Any, ...]:
        return await check("LoRA 1", *fields)

    async def check_second(*fields: Any) -> tuple[Any, ...]:
        return await check("LoRA 2", *fields)

    for handler, lora, name in ((check_first, first, "LoRA 1"), (check_second, second, "LoRA 2")):
        checked = lora.check.click(
            handler,
            [lora.ref, lora.revision, lora.weight, request.prompt, inserted, hinted],
            check_outputs,
            **check_opts,
        )
        checked.then(
            _for_slot(recommend, name),
            [hinted, request.recommended],
            recommend_outputs,
            **recommend_opts,
        )


def wire_generation(
    handlers: Handlers,
    request: RequestPanel,
    base: gr.Dropdown,
    result: ResultPanel,
    status_md: gr.Markdown,
    history: gr.State,
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
        sampler: str,
        clip_skip: float,
        num_images: float,
        recommended: bool,
        seed: float | None,
        randomize: bool,
        browsed: str,
        kept: list,
        page: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> AsyncIterator[tuple[Any, ...]]:
        values: tuple[Any, ...] = (prompt, negative, ref, revision, weight, scale, ref_2, revision_2, weight_2)
        values += (scale_2, size, steps, guidance, sampler, clip_skip, num_images, recommended, seed, randomize)
        values += (browsed, kept)
        form = dict(zip(FORM, values, strict=True))
        with user_errors():
            built = history_ui.request_of(form)
        # An async generator: it yields previews as the engine denoises, and ticks while it waits so that
        # Gradio, which checks the client after each yield, closes it when the browser went away (which cancels
        # the generation, queued or running).
        # Without a LoRA the browsed base's pool generates; a LoRA runs on the base it was made for.
        on_base = pool_ui.request_base(handlers, browsed, bool(built.loras))
        skip = (gr.skip(),) * 5
        async for item in generate(handlers, built, progress, transport="ui", base=on_base):
            if isinstance(item, Frame):
                yield item.image, fmt.preview_html(item.step, int(steps)), gr.skip(), gr.skip(), *skip
            elif item is None:
                yield (gr.skip(),) * 4 + skip
            else:
                share, shown, now = history_ui.remember(form, item, base_url(dict(page.headers)))
                several = len(item.images) > 1
                gallery = gr.Gallery(value=history_ui.cells(item) if several else None, visible=several)
                status = await pool_ui.status(handlers)
                yield item.image, fmt.result_html(item), item.seed, status, gallery, share, shown, now, gr.skip()

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
        request.sampler,
        request.clip_skip,
        request.num_images,
        request.recommended,
        request.seed,
        request.randomize,
        base,
        history,
    ]
    assert len(inputs) == len(FORM)
    outputs = [result.image, result.info, request.seed, status_md, result.gallery, result.share, result.history]
    gr.on(
        [request.run.click, request.prompt.submit],
        generate_ui,
        inputs,
        [*outputs, history, result.use_again],
        concurrency_id=PIPELINE,
        # The scheduler is the one queue and limit for every transport: Gradio hands generations over at once
        # (they wait on the scheduler, holding no thread), rather than keeping a second queue.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress_on=result.image,
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
        sampler: str,
        clip_skip: float,
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
                sampler,
                int(clip_skip or 1) - 1,
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
            request.sampler,
            request.clip_skip,
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
        return pool_ui.snippets(handlers, base_url(dict(request.headers)))

    demo.load(status, None, status_md, api_visibility=PRIVATE, queue=False)
    refresh.click(status, None, status_md, api_visibility=PRIVATE, queue=False)
    demo.load(snippets, None, api_md, api_visibility=PRIVATE, queue=False)


def _for_slot(recommend: Callable[[dict, bool, str], tuple[Any, ...]], slot: str) -> Callable[..., tuple[Any, ...]]:
    def for_slot(hints: dict, on: bool) -> tuple[Any, ...]:
        return recommend(hints, on, slot)

    return for_slot
