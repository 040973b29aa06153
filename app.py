"""LoRA Switchboard: the Gradio UI, its named API, and one server that also answers inference-API POSTs.

Thin on purpose: handlers validate, call the engine or the catalogue, and format
what comes back (`app_format`). Nothing is loaded at import; `main()` builds the
runtime (`engine.runtime.build_runtime`) and serves it. Engine and catalogue
errors become `gr.Error` here and nowhere else.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import gradio as gr

# On ZeroGPU `spaces` must come before anything that initialises CUDA; elsewhere it is cheap and inert.
import spaces  # noqa: F401

import app_format as fmt
from engine.errors import EngineError
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import CatalogError
from lora_catalog.hub import SORTS

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from engine.runtime import GpuRunner
    from engine.service import Engine
    from lora_catalog.catalog import Catalog

__all__ = ["StepProgress", "build_demo", "main", "serve", "user_errors"]

logger = logging.getLogger(__name__)

PAGE_SIZE = 24
_PIPELINE = "pipeline"  # UI and API generation share it: one generation at a time on the one pipeline
_BROWSE = "catalog"
_PRIVATE = "private"
_SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif")
_MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")
_TITLES = {
    "UnknownLoraError": "LoRA not found",
    "LoraNotFoundError": "LoRA not found",
    "GatedLoraError": "Gated LoRA",
    "IncompatibleLoraError": "Incompatible LoRA",
    "UnsupportedLoraVariantError": "Unsupported LoRA variant",
    "EngineBusyError": "Busy",
    "HubUnavailableError": "Hub unreachable",
    "HubUnreachableError": "Hub unreachable",
}


@contextmanager
def user_errors() -> Iterator[None]:
    """Engine and catalogue errors become messages for the person (or client) that asked."""
    try:
        yield
    except (EngineError, CatalogError) as e:
        raise gr.Error(str(e), title=_TITLES.get(type(e).__name__, "Request refused"), print_exception=False) from e


class StepProgress:
    """Feeds the engine's per-step callback into Gradio's progress bar (a class, so ZeroGPU can pickle it)."""

    def __init__(self, progress: gr.Progress) -> None:
        self.progress = progress

    def __call__(self, step: int, total: int) -> None:
        self.progress((step, total), desc="Denoising", unit="steps")


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
        from engine.runtime import GpuRunner

        runner = GpuRunner(engine, zero_gpu=engine.settings.zero_gpu)
    loaded, settings = engine.loaded, engine.settings
    defaults = loaded.defaults
    served = loaded.base_model_id
    sizes = fmt.size_presets(defaults)
    placeholder = fmt.placeholder_image()

    def generate(request: GenerateRequest, progress: gr.Progress) -> GenerateResult:
        progress(0, desc="Preparing LoRAs (download, convert)")
        with user_errors():
            return runner.generate(request, progress=StepProgress(progress))

    # -- browsing --------------------------------------------------------------------------------

    def browse(base: str, search: str, sort: str, page: int) -> tuple[Any, ...]:
        with user_errors():
            result = catalog.page(base or served, search=search or "", sort=sort, page=max(0, int(page)),
                                  page_size=PAGE_SIZE)  # fmt: skip
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
            *(gr.skip() if second else value for value in fields),
            *(value if second else gr.skip() for value in fields),
            new_prompt,
            {**inserted, slot: trigger},
        )

    def check(slot: str, ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        spec = fmt.lora_spec(ref, 1.0, revision, weight)
        if spec is None:
            return fmt.error_card("Type a Hub repo id (owner/name) or a local: file first."), prompt, inserted
        try:
            entry = catalog.resolve(spec.ref, spec.revision, spec.weight_name)
            checked = engine.check_lora(spec)
        except (EngineError, CatalogError) as e:
            return fmt.error_card(str(e)), prompt, inserted
        trigger = entry.trigger_words[0] if entry.trigger_words else None
        new_prompt = fmt.insert_trigger(prompt, inserted.get(slot), trigger)
        return fmt.entry_card(entry, hub_url, checked), new_prompt, {**inserted, slot: trigger}

    def check_first(ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        return check("LoRA 1", ref, revision, weight, prompt, inserted)

    def check_second(ref: str, revision: str, weight: str, prompt: str, inserted: dict) -> tuple[Any, ...]:
        return check("LoRA 2", ref, revision, weight, prompt, inserted)

    # -- generating ------------------------------------------------------------------------------

    def generate_ui(
        prompt: str, negative: str, ref: str, revision: str, weight: str, scale: float, ref_2: str,
        revision_2: str, weight_2: str, scale_2: float, size: str, steps: float, guidance: float, seed: float | None,
        randomize: bool, progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio asks for progress)
    ) -> tuple[Any, ...]:  # fmt: skip
        with user_errors():
            width, height = fmt.parse_size(size)
            specs = (fmt.lora_spec(ref, scale, revision, weight), fmt.lora_spec(ref_2, scale_2, revision_2, weight_2))
            request = GenerateRequest(
                prompt=prompt, negative_prompt=negative, loras=tuple(s for s in specs if s is not None),
                steps=int(steps), guidance=float(guidance), width=width, height=height,
                seed=fmt.seed_value(seed, randomize),
            )  # fmt: skip
        result = generate(request, progress)
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
                    label="LoRAs", columns=4, height="auto", allow_preview=False, object_fit="cover",
                    elem_id="lora-gallery", buttons=[],
                )  # fmt: skip
                with gr.Row(elem_classes="nav-row"):
                    prev_btn = gr.Button("◀ Previous", size="sm", interactive=False, scale=0)
                    page_info = gr.Markdown("loading…", elem_id="page-info")
                    next_btn = gr.Button("Next ▶", size="sm", interactive=False, scale=0)
                details = gr.HTML("<div class='lora-card'><em>Select a LoRA to see its details.</em></div>",
                                  elem_id="lora-details")  # fmt: skip
            with gr.Column(scale=4):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", placeholder="a fox in a forest")
                negative = gr.Textbox(label="Negative prompt", lines=1, placeholder="blurry, low quality")
                slot = gr.Radio(["LoRA 1", "LoRA 2"], value="LoRA 1", label="A gallery click fills")
                with gr.Group():
                    ref = gr.Textbox(label="LoRA 1 — Hub repo id or local: file", elem_id="lora-1",
                                     placeholder="owner/name (optional)")  # fmt: skip
                    scale = gr.Slider(-2, 2, value=1.0, step=0.05, label="LoRA 1 scale", elem_id="lora-1-scale")
                    with gr.Accordion("Revision, weight file, check", open=False):
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
                    steps = gr.Slider(1, settings.max_steps, value=defaults.steps, step=1, label="Steps")
                    guidance = gr.Slider(0, 20, value=defaults.guidance, step=0.5, label="Guidance")
                with gr.Row():
                    seed = gr.Number(-1, label="Seed (used seed shows here)", precision=0, minimum=-1)
                    randomize = gr.Checkbox(True, label="Random seed each time")
                run = gr.Button("Generate", variant="primary", size="lg", elem_id="generate")
                image = gr.Image(
                    label="Result", type="pil", format="png", interactive=False, elem_id="result", height=420,
                    buttons=["download", "fullscreen"], elem_classes="tiny-output" if defaults.side < 256 else None,
                )  # fmt: skip
                info = gr.HTML(elem_id="result-info")
        with gr.Accordion("Engine status", open=False):
            status_md = gr.Markdown(elem_id="engine-status")
            refresh = gr.Button("Refresh", size="sm")
        with gr.Accordion("Use via API", open=False):
            api_md = gr.Markdown(elem_id="api-snippets")

        browse_outputs = [gallery, entries, page, page_info, prev_btn, next_btn]
        browse_opts: dict[str, Any] = {"concurrency_id": _BROWSE, "concurrency_limit": 4, "api_visibility": _PRIVATE}
        demo.load(first_page, [base, search, sort], browse_outputs, **browse_opts)
        gr.on([base.change, sort.change, search.submit], first_page, [base, search, sort], browse_outputs,
              **browse_opts)  # fmt: skip
        next_btn.click(next_page, [base, search, sort, page], browse_outputs, **browse_opts)
        prev_btn.click(previous_page, [base, search, sort, page], browse_outputs, **browse_opts)
        gallery.select(select, [entries, slot, prompt, inserted],
                       [details, ref, revision, weight, ref_2, revision_2, weight_2, prompt, inserted],
                       **browse_opts)  # fmt: skip
        check_opts: dict[str, Any] = {
            "concurrency_id": "lora_check",
            "concurrency_limit": 2,
            "api_visibility": _PRIVATE,
        }
        check_btn.click(check_first, [ref, revision, weight, prompt, inserted], [details, prompt, inserted],
                        **check_opts)  # fmt: skip
        check_btn_2.click(check_second, [ref_2, revision_2, weight_2, prompt, inserted], [details, prompt, inserted],
                          **check_opts)  # fmt: skip
        gr.on([run.click, prompt.submit], generate_ui,
              [prompt, negative, ref, revision, weight, scale, ref_2, revision_2, weight_2, scale_2, size, steps,
               guidance, seed, randomize],
              [image, info, seed, status_md], concurrency_id=_PIPELINE, concurrency_limit=1,
              api_visibility=_PRIVATE)  # fmt: skip
        demo.load(status, None, status_md, api_visibility=_PRIVATE, queue=False)
        refresh.click(status, None, status_md, api_visibility=_PRIVATE, queue=False)
        demo.load(snippets, None, api_md, api_visibility=_PRIVATE, queue=False)
        _api_endpoints(engine, catalog, generate, served)
    demo.queue(max_size=settings.max_queue, default_concurrency_limit=1)
    return demo


def _api_endpoints(engine: Engine, catalog: Catalog, generate: Any, served: str) -> None:
    """The named API for gradio_client: hidden inputs; each parameter is named after the function's argument."""
    defaults = engine.loaded.defaults
    with gr.Column(visible=False):
        prompt, negative_prompt, lora, lora_2 = gr.Textbox(), gr.Textbox(""), gr.Textbox(""), gr.Textbox("")
        lora_scale, lora_2_scale = gr.Number(1.0), gr.Number(1.0)
        steps, guidance = gr.Number(defaults.steps, precision=0), gr.Number(defaults.guidance)
        width, height = gr.Number(defaults.side, precision=0), gr.Number(defaults.side, precision=0)
        seed, page = gr.Number(-1, precision=0), gr.Number(0, precision=0)
        base, search, sort = gr.Textbox(""), gr.Textbox(""), gr.Textbox("downloads")
        repo_id, revision, weight_name = gr.Textbox(), gr.Textbox(""), gr.Textbox("")
        image = gr.Image(type="pil", format="png", label="image")
        info, page_json, lora_json = gr.JSON(label="info"), gr.JSON(label="page"), gr.JSON(label="lora")
        trigger = gr.Button()

    def generate_api(
        prompt: str, negative_prompt: str, lora: str, lora_scale: float, lora_2: str, lora_2_scale: float,
        steps: int | None, guidance: float | None, width: int | None, height: int | None, seed: int | None,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (how Gradio hands out progress)
    ) -> tuple[Any, dict[str, Any]]:  # fmt: skip
        """Generate an image; `lora` and `lora_2` are Hub repo ids or local: files ("" for none); seed -1 is random."""
        with user_errors():
            specs = (fmt.lora_spec(lora, lora_scale), fmt.lora_spec(lora_2, lora_2_scale))
            request = GenerateRequest(
                prompt=prompt, negative_prompt=negative_prompt or "", loras=tuple(s for s in specs if s),
                steps=steps, guidance=guidance, width=width, height=height, seed=fmt.seed_value(seed),
            )  # fmt: skip
        result = generate(request, progress)
        return result.image, fmt.result_info(result)

    def catalog_api(base: str, search: str, sort: str, page: int | None) -> dict[str, Any]:
        """One page of LoRAs for a base model ("" for the served one), and how fresh the list is."""
        with user_errors():
            result = catalog.page(base or served, search=search or "", sort=sort or "downloads", page=page or 0,
                                  page_size=PAGE_SIZE)  # fmt: skip
        freshness = result.freshness
        return {
            "entries": [e.to_json() for e in result.entries],
            "page": result.page,
            "page_size": result.page_size,
            "total_known": result.total_known,
            "has_more": result.has_more,
            "freshness": {
                "source": freshness.source,
                "updated_at": freshness.updated_at.isoformat() if freshness.updated_at else None,
                "offline": freshness.offline,
                "message": freshness.message,
            },
        }

    def lora_info(repo_id: str, revision: str, weight_name: str) -> dict[str, Any]:
        """What a LoRA is (its catalogue entry) and whether it loads here (rank, size, layers, warnings)."""
        with user_errors():
            spec = fmt.lora_spec(repo_id, 1.0, revision, weight_name) or LoraSpec(repo_id or "")
            entry = catalog.resolve(spec.ref, spec.revision, spec.weight_name)
            checked = engine.check_lora(spec)
        return {"entry": entry.to_json(), "check": fmt.check_info(checked)}

    trigger.click(
        generate_api,
        [prompt, negative_prompt, lora, lora_scale, lora_2, lora_2_scale, steps, guidance, width, height, seed],
        [image, info],
        api_name="generate",
        concurrency_id=_PIPELINE,
        concurrency_limit=1,
    )
    trigger.click(catalog_api, [base, search, sort, page], page_json, api_name="catalog", concurrency_id=_BROWSE,
                  concurrency_limit=4)  # fmt: skip
    trigger.click(lora_info, [repo_id, revision, weight_name], lora_json, api_name="lora_info",
                  concurrency_id="lora_check", concurrency_limit=2)  # fmt: skip


def _example_lora(catalog: Catalog, served: str) -> str:
    try:
        entries = catalog.page(served, page_size=1).entries
    except CatalogError:
        entries = ()
    return entries[0].ref if entries else "minimaxir/sdxl-wrong-lora"


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
    from engine.http_api import make_routes
    from engine.runtime import build_runtime
    from engine.settings import Settings

    settings = Settings.from_env(os.environ)
    logging.basicConfig(level=settings.log_level_number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runtime = build_runtime(settings)
    demo = build_demo(
        runtime.engine,
        runtime.catalog,
        banner=runtime.banner,
        runner=runtime.runner,
        hub_url=runtime.hub_url,
        boot_s=runtime.boot_s,
    )
    # Spaces set GRADIO_SERVER_NAME=0.0.0.0; elsewhere we listen on all interfaces too, like a Space does.
    server_name = None if os.environ.get("GRADIO_SERVER_NAME") else "0.0.0.0"
    serve(
        demo, make_routes(runtime.runner), server_name=server_name, allowed_paths=[str(d) for d in runtime.local_dirs]
    )


if __name__ == "__main__":
    main()
