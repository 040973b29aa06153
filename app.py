"""LoRA Switchboard: the Gradio UI, its named API, and one server that also answers inference-API POSTs.

Thin on purpose: handlers validate, call the engine or the catalogue, and format
what comes back (`serving.format`); the named API lives in `serving.gradio_api`, which is also
the one place engine and catalogue errors become `gr.Error`. Nothing is loaded
at import; `main()` builds the runtime (`serving.runtime.build_runtime`) and serves it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr

# On ZeroGPU `spaces` must come before anything that initialises CUDA; elsewhere it is cheap and inert.
import spaces  # noqa: F401

from engine.errors import SwitchboardError
from engine.requests import GenerateRequest, GenerateResult
from lora_catalog.entries import LoraEntry
from lora_catalog.hub import SORTS
from serving import format as fmt
from serving.errors import user_errors
from serving.gradio_api import BROWSE, CHECK, PAGE_SIZE, PIPELINE, StepProgress, add_api_endpoints

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from engine.scheduler import QueueView
    from engine.service import Engine
    from lora_catalog.catalog import Catalog
    from serving.runtime import GpuRunner

__all__ = ["build_demo", "main", "serve"]

logger = logging.getLogger(__name__)

_PRIVATE = "private"
_SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif")
_MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def build_demo(
    engine: Engine,
    catalog: Catalog,
    *,
    banner: str | None = None,
    runner: GpuRunner | None = None,
    hub_url: str = "https://huggingface.co",
    boot_s: float | None = None,
) -> gr.Blocks:
    """The Blocks for one engine and catalogue; every handler is a closure over them (no global state)."""
    if runner is None:
        from serving.runtime import GpuRunner

        runner = GpuRunner(engine, zero_gpu=engine.settings.zero_gpu)
    loaded, settings = engine.loaded, engine.settings
    defaults = loaded.defaults
    served = loaded.base_model_id
    sizes = fmt.size_presets(defaults)
    placeholder = fmt.placeholder_image()

    async def generate(request: GenerateRequest, progress: gr.Progress) -> GenerateResult:
        # The scheduler is the one queue: this waits on it (no thread held) and shows the place it gives.
        def on_queue(view: QueueView) -> None:
            progress(0, desc=fmt.queue_text(view))

        with user_errors():
            return await runner.generate_async(request, progress=StepProgress(progress), on_queue=on_queue)

    # -- browsing --------------------------------------------------------------------------------

    def browse(base: str, search: str, sort: str, page: int) -> tuple[Any, ...]:
        with user_errors():
            result = catalog.page(
                base or served, search=search or "", sort=sort, page=max(0, int(page)), page_size=PAGE_SIZE
            )
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

    def first_page(base: str, search: str, sort: str) -> tuple[Any, ...]:
        return browse(base, search, sort, 0)

    def next_page(base: str, search: str, sort: str, page: int) -> tuple[Any, ...]:
        return browse(base, search, sort, page + 1)

    def previous_page(base: str, search: str, sort: str, page: int) -> tuple[Any, ...]:
        return browse(base, search, sort, max(0, page - 1))

    def select(entries: list[dict], slot: str, prompt: str, inserted: dict, evt: gr.SelectData) -> tuple[Any, ...]:
        entry = LoraEntry.from_json(entries[evt.index])
        trigger = entry.trigger_words[0] if entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, inserted.get(slot), trigger)
        fields = (entry.ref, "", entry.weight_name if entry.source == "hub" else "")
        second = slot == "LoRA 2"
        return (
            fmt.entry_card(entry, hub_url),
            fmt.readiness_html(entry.ref, "preparing"),
            *(gr.skip() if second else value for value in fields),
            *(value if second else gr.skip() for value in fields),
            new_prompt,
            {**inserted, slot: trigger},
        )

    async def prefetch(ref: str, revision: str, weight: str) -> str:
        """Prepare the LoRA just selected, so that Generate finds it in the cache; the badge says when."""
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return ""
        try:
            await asyncio.wrap_future(engine.prefetch(spec))
        except SwitchboardError as e:
            return fmt.readiness_html(spec.ref, "failed", str(e))
        return fmt.readiness_html(spec.ref, "ready")

    async def prefetch_selected(
        slot: str, ref: str, revision: str, weight: str, ref_2: str, revision_2: str, weight_2: str
    ) -> str:
        if slot == "LoRA 2":
            return await prefetch(ref_2, revision_2, weight_2)
        return await prefetch(ref, revision, weight)

    def check(slot: str, ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return fmt.error_card("Type a Hub repo id (owner/name) or a local: file first."), prompt, inserted
        try:
            entry = catalog.resolve(spec.ref, spec.revision, spec.weight_name)
            checked = engine.check_lora(spec)
        except SwitchboardError as e:
            return fmt.error_card(str(e)), prompt, inserted
        trigger = entry.trigger_words[0] if entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, inserted.get(slot), trigger)
        return fmt.entry_card(entry, hub_url, checked), new_prompt, {**inserted, slot: trigger}

    def check_first(ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        return check("LoRA 1", ref, revision, weight, prompt, inserted)

    def check_second(ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        return check("LoRA 2", ref, revision, weight, prompt, inserted)

    # -- generating ------------------------------------------------------------------------------

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
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> tuple[Any, ...]:
        with user_errors():
            width, height = fmt.parse_size(size)
            specs = (fmt.lora_spec(ref, scale, revision, weight), fmt.lora_spec(ref_2, scale_2, revision_2, weight_2))
            request = GenerateRequest(
                prompt=prompt,
                negative_prompt=negative,
                loras=tuple(s for s in specs if s is not None),
                steps=int(steps),
                guidance=float(guidance),
                width=width,
                height=height,
                seed=fmt.seed_value(seed, randomize),
            )
        result = await generate(request, progress)
        return result.image, fmt.result_html(result), result.seed, fmt.status_markdown(engine.status(), boot_s)

    def status() -> str:
        return fmt.status_markdown(engine.status(), boot_s)

    def snippets(request: gr.Request) -> str:
        example = _example_lora(catalog, served)
        return fmt.api_snippets(fmt.base_url(dict(request.headers)), example, defaults)

    with gr.Blocks(title="LoRA Switchboard") as demo:
        if banner:
            gr.Markdown(banner, elem_classes="banner", elem_id="banner")
        gr.Markdown(
            "# LoRA Switchboard\nPick a LoRA from the Hub (or name your own), write a prompt, generate. "
            "One warm SDXL pipeline swaps LoRAs in milliseconds.",
            elem_classes="hero",
        )
        entries = gr.State([])
        page = gr.State(0)
        inserted = gr.State({})
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                with gr.Row():
                    base = gr.Dropdown(fmt.base_choices(served), value=served, label="Base model", scale=2)
                    sort = gr.Dropdown(list(SORTS), value="downloads", label="Sort by", scale=1)
                search = gr.Textbox(label="Search", placeholder="style, subject, trigger word… (Enter)")
                gallery = gr.Gallery(
                    label="LoRAs",
                    columns=4,
                    height="auto",
                    allow_preview=False,
                    object_fit="cover",
                    elem_id="lora-gallery",
                    buttons=[],
                )
                with gr.Row(elem_classes="nav-row"):
                    prev_btn = gr.Button("◀ Previous", size="sm", interactive=False, scale=0)
                    page_info = gr.Markdown("loading…", elem_id="page-info")
                    next_btn = gr.Button("Next ▶", size="sm", interactive=False, scale=0)
                details = gr.HTML(
                    "<div class='lora-card'><em>Select a LoRA to see its details.</em></div>", elem_id="lora-details"
                )
                readiness = gr.HTML("", elem_id="lora-ready")
            with gr.Column(scale=4):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", placeholder="a fox in a forest")
                negative = gr.Textbox(label="Negative prompt", lines=1, placeholder="blurry, low quality")
                slot = gr.Radio(["LoRA 1", "LoRA 2"], value="LoRA 1", label="A gallery click fills")
                with gr.Group():
                    ref = gr.Textbox(
                        label="LoRA 1 — Hub repo id or local: file",
                        elem_id="lora-1",
                        placeholder="owner/name (optional)",
                    )
                    scale = gr.Slider(-2, 2, value=1.0, step=0.05, label="LoRA 1 scale", elem_id="lora-1-scale")
                    with gr.Accordion("Revision, weight file, check", open=False, elem_id="lora-1-options"):
                        revision = gr.Textbox(label="Revision (branch, tag or commit)", placeholder="main")
                        weight = gr.Textbox(label="Weight file", placeholder="only needed when the repo holds several")
                        check_btn = gr.Button("Check this LoRA", size="sm")
                with gr.Accordion("Blend a second LoRA", open=False), gr.Group():
                    ref_2 = gr.Textbox(label="LoRA 2 — Hub repo id or local: file", elem_id="lora-2")
                    scale_2 = gr.Slider(-2, 2, value=1.0, step=0.05, label="LoRA 2 scale")
                    revision_2 = gr.Textbox(label="Revision", placeholder="main")
                    weight_2 = gr.Textbox(label="Weight file")
                    check_btn_2 = gr.Button("Check LoRA 2", size="sm")
                with gr.Row():
                    size = gr.Dropdown(sizes, value=sizes[0][1], label="Size")
                    steps = gr.Slider(
                        1, settings.max_steps, value=defaults.steps, step=1, label="Steps", elem_id="steps"
                    )
                    guidance = gr.Slider(0, 20, value=defaults.guidance, step=0.5, label="Guidance")
                with gr.Row():
                    seed = gr.Number(-1, label="Seed", info="the seed used shows here", precision=0, minimum=-1)
                    randomize = gr.Checkbox(True, label="Random seed each time")
                run = gr.Button("Generate", variant="primary", size="lg", elem_id="generate")
                image = gr.Image(
                    label="Result",
                    type="pil",
                    format="png",
                    interactive=False,
                    elem_id="result",
                    height=420,
                    buttons=["download", "fullscreen"],
                    elem_classes="tiny-output" if defaults.side < 256 else None,
                )
                info = gr.HTML(elem_id="result-info")
        with gr.Accordion("Engine status", open=False, elem_id="status-panel"):
            status_md = gr.Markdown(elem_id="engine-status")
            refresh = gr.Button("Refresh", size="sm")
        with gr.Accordion("Use via API: Python and curl", open=False, elem_id="api-panel"):
            api_md = gr.Markdown(elem_id="api-snippets")

        browse_outputs = [gallery, entries, page, page_info, prev_btn, next_btn]
        browse_opts: dict[str, Any] = {"concurrency_id": BROWSE, "concurrency_limit": 4, "api_visibility": _PRIVATE}
        demo.load(first_page, [base, search, sort], browse_outputs, **browse_opts)
        gr.on(
            [base.change, sort.change, search.submit], first_page, [base, search, sort], browse_outputs, **browse_opts
        )
        next_btn.click(next_page, [base, search, sort, page], browse_outputs, **browse_opts)
        prev_btn.click(previous_page, [base, search, sort, page], browse_outputs, **browse_opts)
        gallery.select(
            select,
            [entries, slot, prompt, inserted],
            [details, readiness, ref, revision, weight, ref_2, revision_2, weight_2, prompt, inserted],
            **browse_opts,
        ).then(
            prefetch_selected,
            [slot, ref, revision, weight, ref_2, revision_2, weight_2],
            readiness,
            # Waits on the scheduler's preparation pool, not on a thread of Gradio's.
            concurrency_limit=None,
            api_visibility=_PRIVATE,
            show_progress="hidden",
        )
        check_opts: dict[str, Any] = {
            "concurrency_id": CHECK,
            "concurrency_limit": 2,
            "api_visibility": _PRIVATE,
        }
        check_btn.click(
            check_first, [ref, revision, weight, prompt, inserted], [details, prompt, inserted], **check_opts
        )
        check_btn_2.click(
            check_second, [ref_2, revision_2, weight_2, prompt, inserted], [details, prompt, inserted], **check_opts
        )
        lora_inputs = [ref, revision, weight, scale, ref_2, revision_2, weight_2, scale_2]
        generate_inputs = [prompt, negative, *lora_inputs, size, steps, guidance, seed, randomize]
        gr.on(
            [run.click, prompt.submit],
            generate_ui,
            generate_inputs,
            [image, info, seed, status_md],
            concurrency_id=PIPELINE,
            # The scheduler is the one queue and limit for every transport: Gradio hands generations over at
            # once (they wait on the scheduler, holding no thread), rather than keeping a second queue.
            concurrency_limit=None,
            api_visibility=_PRIVATE,
            show_progress_on=image,
        )
        demo.load(status, None, status_md, api_visibility=_PRIVATE, queue=False)
        refresh.click(status, None, status_md, api_visibility=_PRIVATE, queue=False)
        demo.load(snippets, None, api_md, api_visibility=_PRIVATE, queue=False)
        add_api_endpoints(engine, catalog, generate, served)
    # Gradio's queue only holds catalogue and check events now (generations pass straight to the scheduler,
    # which enforces MAX_QUEUE); a size here would be a second, different limit on generations.
    demo.queue(max_size=None, default_concurrency_limit=1)
    return demo


def _example_lora(catalog: Catalog, served: str) -> str:
    """A LoRA to show in the snippets: the best-known Hub one if any, else whatever is listed first."""
    try:
        entries = catalog.page(served, page_size=PAGE_SIZE).entries
    except SwitchboardError:
        entries = ()
    hub = [e for e in entries if e.source == "hub"]
    return (hub or list(entries))[0].ref if entries else "minimaxir/sdxl-wrong-lora"


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
    demo = build_demo(
        runtime.engine,
        runtime.catalog,
        banner=runtime.banner,
        runner=runtime.runner,
        hub_url=runtime.hub_url,
        boot_s=runtime.boot_s,
    )
    serve(
        demo,
        make_routes(runtime.runner),
        server_name=settings.server_name,
        server_port=settings.server_port,
        allowed_paths=[str(d) for d in runtime.local_dirs],
    )


if __name__ == "__main__":
    main()
