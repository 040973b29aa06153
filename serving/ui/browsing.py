"""The catalogue panel's events: browsing pages, picking a LoRA (its card, trigger word, pool controls and a
prefetch), checking a typed LoRA, and the LoRAs' recommended settings (`serving.ui.events` wires the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import gradio as gr

from engine.errors import SwitchboardError
from lora_catalog.entries import LoraEntry
from serving.errors import user_errors
from serving.handlers import PAGE_SIZE, Handlers
from serving.ui import formatting as fmt
from serving.ui import pools as pool_ui
from serving.ui.events import PRIVATE
from serving.ui.gradio_api import BROWSE, CHECK
from serving.ui.panels import Browser, ComparePanel, RequestPanel
from serving.ui.prefetches import SessionPrefetches

__all__ = ["wire_browsing"]

_Outputs = Callable[..., tuple[Any, ...]]


# The registration order below is the one the events always had (Gradio numbers its functions in that order).
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
    browse = _browse(handlers)
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
    recommend = _recommend(handlers, len(recommend_outputs))
    recommend_opts: dict[str, Any] = {"api_visibility": PRIVATE, "queue": False, "show_progress": "hidden"}
    browser.base.change(_on_base(handlers), [browser.base, pending], [browser.note, *pool_controls, pending], **opts)
    request.recommended.change(
        recommend, [hinted, request.recommended, request.slot], recommend_outputs, **recommend_opts
    )
    browser.next.click(lambda b, s, o, src, n: browse(b, s, o, src, n + 1), [*filters, page], outputs, **opts)
    browser.previous.click(
        lambda b, s, o, src, n: browse(b, s, o, src, max(0, n - 1)), [*filters, page], outputs, **opts
    )
    _wire_selection(demo, handlers, browser, request, comparison, state, hub_url, pool_controls, recommend)
    check_outputs = [browser.details, request.prompt, inserted, hinted]
    _wire_checks(_check(handlers, hub_url), request, check_outputs, inserted, hinted, recommend, recommend_opts)


def _wire_selection(
    demo: gr.Blocks,
    handlers: Handlers,
    browser: Browser,
    request: RequestPanel,
    comparison: ComparePanel,
    state: tuple[gr.State, gr.State, gr.State, gr.State, gr.State],
    hub_url: str,
    pool_controls: list[Any],
    recommend: Callable[[dict, bool, str], tuple[Any, ...]],
) -> None:
    """A gallery pick: its card and fields, then its recommended settings and a prefetch of it."""
    entries, _, inserted, hinted, _ = state
    prefetches = SessionPrefetches()
    first, second = request.first, request.second
    opts: dict[str, Any] = {"concurrency_id": BROWSE, "concurrency_limit": 4, "api_visibility": PRIVATE}
    recommend_outputs = [request.steps, request.guidance, request.sampler, request.clip_skip, request.note]
    recommend_opts: dict[str, Any] = {"api_visibility": PRIVATE, "queue": False, "show_progress": "hidden"}
    selected = browser.gallery.select(
        _select(handlers, hub_url),
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
        _prefetch(handlers, prefetches),
        [request.slot, first.ref, first.revision, first.weight, second.ref, second.revision, second.weight],
        browser.readiness,
        # Waits in the pool's prefetch lane, not on a thread of Gradio's.
        concurrency_limit=None,
        api_visibility=PRIVATE,
        show_progress="hidden",
    )
    demo.unload(_leave(prefetches))


def _wire_checks(
    check: Callable[..., Coroutine[Any, Any, tuple[Any, ...]]],
    request: RequestPanel,
    check_outputs: list[Any],
    inserted: gr.State,
    hinted: gr.State,
    recommend: Callable[[dict, bool, str], tuple[Any, ...]],
    recommend_opts: dict[str, Any],
) -> None:
    """Each LoRA field's Check button, then its recommended settings."""
    recommend_outputs = [request.steps, request.guidance, request.sampler, request.clip_skip, request.note]
    check_opts: dict[str, Any] = {"concurrency_id": CHECK, "concurrency_limit": 2, "api_visibility": PRIVATE}

    # Gradio awaits a handler only when it is a coroutine function itself.
    async def check_first(*fields: Any) -> tuple[Any, ...]:
        return await check("LoRA 1", *fields)

    async def check_second(*fields: Any) -> tuple[Any, ...]:
        return await check("LoRA 2", *fields)

    for handler, lora, name in ((check_first, request.first, "LoRA 1"), (check_second, request.second, "LoRA 2")):
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


def _browse(handlers: Handlers) -> _Outputs:
    placeholder = fmt.placeholder_image()

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

    return browse


def _select(handlers: Handlers, hub_url: str) -> _Outputs:
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

    return select


def _prefetch(handlers: Handlers, prefetches: SessionPrefetches) -> Callable[..., Coroutine[Any, Any, Any]]:
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

    return prefetch


def _leave(prefetches: SessionPrefetches) -> Callable[[gr.Request], None]:
    def leave(request: gr.Request) -> None:
        prefetches.leave(request.session_hash or "")

    return leave


def _check(handlers: Handlers, hub_url: str) -> Callable[..., Coroutine[Any, Any, tuple[Any, ...]]]:
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

    return check


def _recommend(handlers: Handlers, outputs: int) -> Callable[[dict, bool, str], tuple[Any, ...]]:
    def recommend(hints: dict, on: bool, slot: str) -> tuple[Any, ...]:
        if slot == "Compare":
            return (gr.skip(),) * outputs
        return pool_ui.recommended(handlers, hints, bool(on))

    return recommend


def _on_base(handlers: Handlers) -> _Outputs:
    def on_base(base: str, waiting: dict | None) -> tuple[Any, ...]:
        # A share link or a history entry that chose this base: its own values, not the pool's defaults.
        values = waiting["controls"] if isinstance(waiting, dict) and waiting.get("base") == base else None
        return (*pool_ui.on_base(handlers, base, values), None)

    return on_base


def _for_slot(recommend: Callable[[dict, bool, str], tuple[Any, ...]], slot: str) -> Callable[..., tuple[Any, ...]]:
    def for_slot(hints: dict, on: bool) -> tuple[Any, ...]:
        return recommend(hints, on, slot)

    return for_slot
