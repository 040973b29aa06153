"""The UI's pool-aware pieces: the base filter's note, size presets and defaults that follow the base, the
request's base, per-pool status and per-base API forms. `serving.ui.events` wires them; `serving.ui.pool_views`
formats. The pools are the backend's (`Handlers.pools`), so a front end on a cluster shows the same as a Space
serving its own pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gradio as gr

from lora_catalog.entries import Family, LoraEntry
from lora_catalog.hints import LoraHints
from serving.handlers import Handlers
from serving.ui import formatting as fmt
from serving.ui import pool_views, session
from serving.ui.snippets import api_snippets

if TYPE_CHECKING:
    from engine.outcomes import ServedPool

__all__ = ["controls", "entry_controls", "on_base", "recommended", "request_base", "snippets", "status", "with_hints"]


def controls(pool: ServedPool | None, values: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """Size presets, steps, guidance, samplers, CLIP skip range and the negative prompt box of `pool` (which of
    guidance and the negative prompt its model reads), left as they are for None. `values` (size, steps,
    guidance, sampler, CLIP skip: a share link's or a history entry's) take the place of the pool's defaults."""
    if pool is None:
        return (gr.skip(),) * 6
    defaults = pool.defaults
    presets = fmt.size_presets(defaults)
    size, steps, guidance, sampler, clip_skip = values or (presets[0][1], defaults.steps, defaults.guidance, "", 1)
    return (
        gr.Dropdown(choices=presets, value=size),
        gr.Slider(value=steps),
        gr.Slider(**{**fmt.guidance_control(defaults), "value": guidance}),
        gr.Dropdown(choices=fmt.sampler_choices(defaults), value=sampler),
        gr.Slider(**{**fmt.clip_skip_range(defaults), "value": clip_skip}),
        gr.Textbox(**fmt.negative_control(defaults)),
    )


def on_base(handlers: Handlers, base: str, values: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """A new base in the filter: its note, and its pool's sizes and defaults (or `values`: see `controls`)."""
    pools = handlers.pools
    pool = pool_views.pool_for_base(pools, base) if base else None
    return pool_views.base_note(pools, base or pools[0].base_model_id), *controls(pool, values)


def entry_controls(handlers: Handlers, entry: LoraEntry) -> tuple[Any, ...]:
    """A LoRA picked from the gallery: a warning when no pool serves its family (or, for a fine-tune's Civitai
    LoRA, when it will run on another checkpoint), and its pool's controls."""
    pool = pool_views.pool_for_family(handlers.pools, entry.family)
    warning = ""
    if pool is None and entry.family is not Family.UNKNOWN:
        warning = fmt.error_card(pool_views.unserved_note(handlers.pools, entry.family, "This LoRA"))
    elif note := pool_views.finetune_note(handlers.pools, entry):
        warning = fmt.note_html(note)
    return warning, *controls(pool)


def request_base(handlers: Handlers, base: str, has_loras: bool) -> str:
    """The base a UI request names: none with a LoRA (it runs on its own base), else the browsed base's pool."""
    if has_loras or not base:
        return ""
    pool = pool_views.pool_for_base(handlers.pools, base)
    return pool.base_model_id if pool is not None else ""


async def status(handlers: Handlers) -> str:
    """The status panel: each pool's."""
    return pool_views.pools_status_markdown(await handlers.status(), handlers.boot_s, handlers.pools)


def snippets(handlers: Handlers, url: str) -> str:
    """The API panel: the examples, and the per-base forms."""
    text = api_snippets(url, handlers.example_lora(), handlers.default.defaults)
    return f"{text}\n\n{pool_views.pools_api_snippets(url, handlers.pools)}"


def with_hints(hints: dict, slot: str, entry: LoraEntry) -> dict:
    """The session's LoRA recommendations with `slot`'s now `entry`'s (and the family whose pool it runs on)."""
    return {**hints, slot: {"hints": entry.hints.to_json(), "family": str(entry.family)}}


def recommended(handlers: Handlers, hints: dict, on: bool) -> tuple[Any, ...]:
    """Steps, guidance, sampler, CLIP skip and the note: the LoRAs' recommendations on the pool they run on (a
    speed LoRA's first: `lora_catalog.hints.blend_hints`), or that pool's defaults with the switch off."""
    slots = [hints[slot] for slot in ("LoRA 1", "LoRA 2") if isinstance(hints.get(slot), dict)]
    pool = next(
        (p for s in slots if (p := pool_views.pool_for_family(handlers.pools, s.get("family", ""))) is not None),
        handlers.default,
    )
    loras = [LoraHints.from_json(s.get("hints")) for s in slots]
    return session.recommended(loras, pool.defaults, handlers.settings.max_steps, on)
