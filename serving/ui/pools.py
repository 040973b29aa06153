"""The UI's pool-aware pieces: the base filter's note, size presets and defaults that follow the base, the
request's base, per-pool status and per-base API forms. `app.py` wires them; `serving.ui.pool_views` formats.

A front end (`BACKEND_URL`) knows no pools here: every function then leaves the UI as one pool would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gradio as gr

from lora_catalog.entries import Family, LoraEntry
from serving.handlers import Handlers
from serving.ui import formatting as fmt
from serving.ui import pool_views

if TYPE_CHECKING:
    from engine.pools.pools import Pool

__all__ = ["base_choices", "base_note", "controls", "entry_controls", "request_base", "snippets", "status"]


def base_choices(handlers: Handlers) -> list[tuple[str, str]]:
    """The base filter's choices: served bases marked first."""
    if handlers.pools is None:
        return fmt.base_choices(handlers.served_base)
    return pool_views.base_choices(handlers.pools)


def base_note(handlers: Handlers, base: str) -> str:
    """The line under the base filter: which pool its LoRAs generate on, or why they cannot run here."""
    return pool_views.base_note(handlers.pools, base or handlers.served_base) if handlers.pools is not None else ""


def controls(pool: Pool | None) -> tuple[Any, Any, Any]:
    """Size presets, steps and guidance of `pool` (left as they are for None)."""
    if pool is None:
        return gr.skip(), gr.skip(), gr.skip()
    defaults = pool.engine.defaults
    presets = fmt.size_presets(defaults)
    return (
        gr.Dropdown(choices=presets, value=presets[0][1]),
        gr.Slider(value=defaults.steps),
        gr.Slider(value=defaults.guidance),
    )


def on_base(handlers: Handlers, base: str) -> tuple[Any, ...]:
    """A new base in the filter: its note, and its pool's sizes and defaults."""
    pool = pool_views.pool_for_base(handlers.pools, base) if handlers.pools is not None and base else None
    return base_note(handlers, base), *controls(pool)


def entry_controls(handlers: Handlers, entry: LoraEntry) -> tuple[str, Any, Any, Any]:
    """A LoRA picked from the gallery: a warning when no pool serves its family, and its pool's controls."""
    if handlers.pools is None:
        return "", gr.skip(), gr.skip(), gr.skip()
    pool = pool_views.pool_for_family(handlers.pools, entry.family)
    warning = ""
    if pool is None and entry.family is not Family.UNKNOWN:
        warning = fmt.error_card(pool_views.unserved_note(handlers.pools, entry.family, "This LoRA"))
    return warning, *controls(pool)


def request_base(handlers: Handlers, base: str, has_loras: bool) -> str:
    """The base a UI request names: none with a LoRA (it runs on its own base), else the browsed base's pool."""
    if has_loras or handlers.pools is None or not base:
        return ""
    pool = pool_views.pool_for_base(handlers.pools, base)
    return pool.base_model_id if pool is not None else ""


def status(handlers: Handlers) -> str:
    """The status panel: each pool's, or the one engine's."""
    statuses = handlers.pool_status()
    if statuses is None:
        return fmt.status_markdown(handlers.status(), handlers.boot_s)
    return pool_views.pools_status_markdown(statuses, handlers.boot_s)


def snippets(handlers: Handlers, url: str) -> str:
    """The API panel: the examples, and the per-base forms when pools are served here."""
    text = fmt.api_snippets(url, handlers.example_lora(), handlers.defaults)
    if handlers.pools is None:
        return text
    return f"{text}\n\n{pool_views.pools_api_snippets(url, handlers.pools)}"
