"""LoRA Switchboard: the Gradio UI, its named API, and one server that also answers inference-API POSTs.

Thin on purpose: `build_demo` is a list of panels, each built by a named function; events validate, call
the one shared handler (`serving.handlers`) and format what comes back (`serving.format`). The named API
is `serving.gradio_api`, the HTTP endpoint `serving.http_api`. Nothing is loaded at import; `main()`
builds the runtime (`serving.runtime.build_runtime`) and serves it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import gradio as gr

# On ZeroGPU `spaces` must come before anything that initialises CUDA; elsewhere it is cheap and inert.
import spaces  # noqa: F401

from engine.errors import SwitchboardError
from engine.requests import GenerateRequest
from lora_catalog.entries import LoraEntry
from serving import format as fmt
from serving import panels
from serving.errors import user_errors
from serving.gradio_api import BROWSE, CHECK, PIPELINE, add_api_endpoints, generate
from serving.handlers import PAGE_SIZE, Handlers
from serving.panels import Browser, RequestPanel
from serving.ui_cancel import until_closed

if TYPE_CHECKING:
    from starlette.routing import BaseRoute


__all__ = ["build_demo", "main", "serve"]

logger = logging.getLogger(__name__)

_PRIVATE = "private"
_SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif")
_MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def build_demo(handlers: Handlers, *, banner: str | None = None, hub_url: str = "https://huggingface.co") -> gr.Blocks:
    """The Blocks over one set of handlers; every event is a closure over them (no global state)."""
    with gr.Blocks(title="LoRA Switchboard") as demo:
        panels.header(banner)
        state = (gr.State([]), gr.State(0), gr.State({}))  # entries shown, page, triggers inserted per slot
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                browser = panels.browser_panel(handlers.served_base)
            with gr.Column(scale=4):
                request = panels.request_panel(handlers)
                image, info = panels.result_panel(handlers)
        status_md, refresh = panels.status_panel()
        api_md = panels.api_panel()
        _wire_browsing(demo, handlers, browser, request, state, hub_url)
        _wire_generation(handlers, request, image, info, status_md)
        demo.load(lambda: _status(handlers), None, status_md, api_visibility=_PRIVATE, queue=False)
        refresh.click(lambda: _status(handlers), None, status_md, api_visibility=_PRIVATE, queue=False)
        demo.load(_snippets(handlers), None, api_md, api_visibility=_PRIVATE, queue=False)
        add_api_endpoints(handlers)
    demo.queue(max_size=handlers.max_queue, default_concurrency_limit=1)
    return demo


# -- events ----------------------------------------------------------------------------------------


def _wire_browsing(
    demo: gr.Blocks,
    handlers: Handlers,
    browser: Browser,
    request: RequestPanel,
    state: tuple[gr.State, gr.State, gr.State],
    hub_url: str,
) -> None:
    entries, page, inserted = state
    placeholder = fmt.placeholder_image()
    first, second = request.first, request.second

    def browse(base: str, search: str, sort: str, number: int) -> tuple[Any, ...]:
        with user_errors():
            result = handlers.page(base, search, sort, max(0, int(number)))
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

    def select(shown: list[dict], slot: str, prompt: str, triggers: dict, evt: gr.SelectData) -> tuple[Any, ...]:
        entry = LoraEntry.from_json(shown[evt.index])
        trigger = entry.trigger_words[0] if entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, triggers.get(slot), trigger)
        fields = (entry.ref, "", entry.weight_name if entry.source == "hub" else "")
        is_second = slot == "LoRA 2"
        return (
            fmt.entry_card(entry, hub_url),
            *(gr.skip() if is_second else value for value in fields),
            *(value if is_second else gr.skip() for value in fields),
            new_prompt,
            {**triggers, slot: trigger},
        )

    def check(slot: str, ref: str, revision: str, weight: str, prompt: str, triggers: dict) -> tuple[Any, ...]:
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return fmt.error_card("Type a Hub repo id (owner/name) or a local: file first."), prompt, triggers
        try:
            report = handlers.lora(spec)
        except SwitchboardError as e:
            return fmt.error_card(str(e)), prompt, triggers
        trigger = report.entry.trigger_words[0] if report.entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, triggers.get(slot), trigger)
        return fmt.entry_card(report.entry, hub_url, report.check), new_prompt, {**triggers, slot: trigger}

    filters = [browser.base, browser.search, browser.sort]
    outputs = [browser.gallery, entries, page, browser.page_info, browser.previous, browser.next]
    opts: dict[str, Any] = {"concurrency_id": BROWSE, "concurrency_limit": 4, "api_visibility": _PRIVATE}
    demo.load(lambda b, s, o: browse(b, s, o, 0), filters, outputs, **opts)
    gr.on(
        [browser.base.change, browser.sort.change, browser.search.submit],
        lambda b, s, o: browse(b, s, o, 0),
        filters,
        outputs,
        **opts,
    )
    browser.next.click(lambda b, s, o, n: browse(b, s, o, n + 1), [*filters, page], outputs, **opts)
    browser.previous.click(lambda b, s, o, n: browse(b, s, o, max(0, n - 1)), [*filters, page], outputs, **opts)
    browser.gallery.select(
        select,
        [entries, request.slot, request.prompt, inserted],
        [
            browser.details,
            first.ref,
            first.revision,
            first.weight,
            second.ref,
            second.revision,
            second.weight,
            request.prompt,
            inserted,
        ],
        **opts,
    )
    check_opts: dict[str, Any] = {"concurrency_id": CHECK, "concurrency_limit": 2, "api_visibility": _PRIVATE}
    check_outputs = [browser.details, request.prompt, inserted]
    for name, lora in (("LoRA 1", first), ("LoRA 2", second)):
        lora.check.click(
            partial(check, name),
            [lora.ref, lora.revision, lora.weight, request.prompt, inserted],
            check_outputs,
            **check_opts,
        )


def _wire_generation(
    handlers: Handlers, request: RequestPanel, image: gr.Image, info: gr.HTML, status_md: gr.Markdown
) -> None:
    def generate_ui(
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
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> Iterator[tuple[Any, ...]]:
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
        # A generator, so that Gradio closing it (the browser went away) cancels the generation.
        result = yield from until_closed(partial(generate, handlers, built, progress), (gr.skip(),) * 4)
        yield result.image, fmt.result_html(result), result.seed, _status(handlers)

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
    ]
    gr.on(
        [request.run.click, request.prompt.submit],
        generate_ui,
        inputs,
        [image, info, request.seed, status_md],
        concurrency_id=PIPELINE,
        concurrency_limit=1,
        api_visibility=_PRIVATE,
        show_progress_on=image,
    )


def _status(handlers: Handlers) -> str:
    return fmt.status_markdown(handlers.status(), handlers.boot_s)


def _snippets(handlers: Handlers) -> Callable[[gr.Request], str]:
    # Gradio hands the request only to a function whose own signature asks for it (not through a partial).
    def snippets(request: gr.Request) -> str:
        return fmt.api_snippets(fmt.base_url(dict(request.headers)), handlers.example_lora(), handlers.defaults)

    return snippets


def serve(
    demo: gr.Blocks,
    routes: Sequence[BaseRoute],
    *,
    server_name: str | None = None,
    server_port: int | None = None,
    allowed_paths: Sequence[str] = (),
    block: bool = True,
    quiet: bool = False,
) -> str:
    """Serve the UI, its API and `routes` (the inference-API POST) from one server; returns its local URL."""
    # FastAPI(routes=...) puts ours before Gradio's, so `POST /` is ours while `GET /` stays the UI.
    _, local_url, _ = demo.launch(
        server_name=server_name,
        server_port=server_port,
        app_kwargs={"routes": list(routes)},
        allowed_paths=list(allowed_paths),
        prevent_thread_lock=not block,
        show_error=True,
        quiet=quiet,
        footer_links=["api", "gradio"],
        # System fonts: a Space's visitors should not wait on a font CDN, and offline there is none.
        theme=gr.themes.Soft(primary_hue="violet", secondary_hue="amber", font=_SYSTEM_FONTS, font_mono=_MONO_FONTS),
        css=fmt.APP_CSS,
    )
    return local_url


def main() -> None:
    from engine.errors import SettingsError
    from engine.settings import Settings
    from serving.http_api import make_routes
    from serving.runtime import build_runtime

    try:
        settings = Settings.from_env(os.environ)
        logging.basicConfig(level=settings.log_level_number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        runtime = build_runtime(settings)
    except SettingsError as e:
        raise SystemExit(f"LoRA Switchboard cannot start: {e}") from e
    handlers = Handlers(runtime.engine, runtime.catalog, runtime.runner, boot_s=runtime.boot_s)
    demo = build_demo(handlers, banner=runtime.banner, hub_url=runtime.hub_url)
    serve(
        demo,
        make_routes(runtime.runner),
        server_name=settings.server_name,
        server_port=settings.server_port,
        allowed_paths=[str(d) for d in runtime.local_dirs],
    )


if __name__ == "__main__":
    main()
