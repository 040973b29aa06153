"""What the UI and the API show of the pools: served bases in the filter, per-pool status, per-base API forms.

Only formatting: every function takes the served pools (`engine.outcomes.ServedPool`, from the backend, local
or remote alike) or their status. Importing this module imports no torch (the app's import stays light).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from engine.pools.routing import pool_of_base
from lora_catalog.bases import KNOWN_BASES, family_of_base
from lora_catalog.civitai.bases import civitai_base_for
from lora_catalog.entries import Family, LoraEntry
from serving.ui.formatting import inputs_note
from serving.ui.status_text import status_markdown

if TYPE_CHECKING:
    from engine.outcomes import PoolStatus, ServedPool

__all__ = [
    "base_choices",
    "base_note",
    "display_name",
    "finetune_note",
    "pool_for_base",
    "pool_for_family",
    "pools_api_snippets",
    "pools_status_json",
    "pools_status_markdown",
    "unserved_note",
]

_GIB = 2**30
_NAMES = {b.repo_id.lower(): b.display_name for b in KNOWN_BASES}


def display_name(base_model_id: str) -> str:
    """The catalogue's display name for a base, or the repo id itself."""
    return _NAMES.get(base_model_id.lower(), base_model_id)


def pool_for_family(pools: Sequence[ServedPool], family: Family | str) -> ServedPool | None:
    """The pool a LoRA of `family` runs on (the first of its family), or None when no pool serves it."""
    return next((p for p in pools if p.family == family), None)


def pool_for_base(pools: Sequence[ServedPool], base: str) -> ServedPool | None:
    """The pool LoRAs of `base` run on (`engine.pools.routing.pool_of_base`, the rule routing follows), or None."""
    index = pool_of_base(pools, base)
    return pools[index] if index is not None else None


def base_choices(pools: Sequence[ServedPool]) -> list[tuple[str, str]]:
    """The base filter: served bases first, then bases whose LoRAs run on a served pool, then browse-only ones."""
    # A pool still loading is listed as served: the page is built once, and it serves seconds later (its note and
    # the status panel say it is loading till then).
    served = [(f"{display_name(p.base_model_id)} (served)", p.base_model_id) for p in pools]
    taken = {p.base_model_id.lower() for p in pools}
    runs, browse = [], []
    for base in KNOWN_BASES:
        if base.repo_id.lower() in taken:
            continue
        pool = pool_for_family(pools, base.family)
        if pool is not None:
            runs.append((f"{base.display_name} (runs on {display_name(pool.base_model_id)})", base.repo_id))
        else:
            browse.append((f"{base.display_name} (not served here)", base.repo_id))
    return served + runs + browse


def finetune_note(pools: Sequence[ServedPool], entry: LoraEntry) -> str | None:
    """For a Civitai LoRA trained for a fine-tune (Pony, ...) no pool serves: that it runs on another checkpoint
    (the routing's rule, `pool_of_base`); None otherwise."""
    base = entry.base_models[0] if entry.source == "civitai" and entry.base_models else None
    finetune = civitai_base_for(base) if base else None
    runs_on = pool_for_base(pools, base) if base and finetune and finetune.finetune else None
    if runs_on is None or finetune is None or runs_on.base_model_id.lower() == (base or "").lower():
        return None
    return (
        f"Trained for {finetune.label}, which no pool here serves: it runs on "
        f"{display_name(runs_on.base_model_id)}, a different checkpoint of the same family."
    )


def unserved_note(pools: Sequence[ServedPool], family: Family | str, what: str) -> str:
    """Why LoRAs of `family` cannot run here, naming what is served."""
    served = ", ".join(display_name(p.base_model_id) for p in pools)
    kind = f"the {family} family" if family != Family.UNKNOWN else "an unknown family"
    return f"{what} ({kind}) cannot run here: no pool serves it. This Space serves {served}."


def base_note(pools: Sequence[ServedPool], base: str) -> str:
    """One line under the filter: which pool this base's LoRAs generate on, or why they cannot run here."""
    pool = pool_for_base(pools, base)
    if pool is None:
        return "⚠ " + unserved_note(pools, family_of_base(base), f"LoRAs for {display_name(base)}") + " Browse only."
    if pool.loading:
        return (
            f"LoRAs for {display_name(base)} generate on **{display_name(pool.base_model_id)}** ({pool.family}), "
            "which is still **loading** in the background: ready in a few seconds."
        )
    defaults = pool.defaults
    return (
        f"LoRAs for {display_name(base)} generate on **{display_name(pool.base_model_id)}** "
        f"({pool.family}): {defaults.side}×{defaults.side}, {defaults.steps} steps, {inputs_note(defaults)}."
    )


def pools_status_markdown(
    statuses: Sequence[PoolStatus], boot_s: float | None = None, pools: Sequence[ServedPool] = ()
) -> str:
    """The status panel: one section per pool, with where its pipeline is, then its engine status; then one for
    each of `pools` still loading."""
    loading = [p for p in pools if p.loading]
    if len(statuses) == 1 and not loading:
        return status_markdown(statuses[0].engine, boot_s)
    parts = []
    for status in statuses:
        title = f"### {display_name(status.base_model_id)} ({status.family})" + (" — default" if status.default else "")
        parts.append(f"{title}\n\n{_memory_line(status)}" + status_markdown(status.engine, boot_s))
    for pool in loading:
        parts.append(
            f"### {display_name(pool.base_model_id)} ({pool.family}) — loading…\n\n"
            "Loading in the background: a request to it is answered *loading* (503, Retry-After) until it serves; "
            "refresh to see it."
        )
    return "\n\n".join(parts)


def _memory_line(status: PoolStatus) -> str:
    memory = status.memory
    if memory is None:  # a cluster's pool: its replicas hold the pipeline
        return ""
    where = "on the device" if memory.resident else "waiting in host RAM (moved in on demand)"
    moved = f" · moved in {memory.moves_in}× (last {memory.last_move_s:.2f} s)" if memory.moves_in else ""
    return f"**Pipeline** {memory.nbytes / _GIB:.2f} GiB, {where}{moved}\n\n"


def pools_status_json(statuses: Sequence[PoolStatus], pools: Sequence[ServedPool]) -> dict[str, Any]:
    """The per-pool status for the API, with each pool's request defaults and which inputs it reads
    (`guidance_kind`, `negative_prompt`: FLUX.1 [dev]'s guidance is distilled, [schnell] takes none)."""
    defaults = {p.base_model_id: asdict(p.defaults) for p in pools}
    loading = [
        # A pool still loading: what it is, and its state; its defaults and engine come once it serves.
        {"base_model_id": p.base_model_id, "model_id": p.model_id, "family": p.family, "default": False}
        | {"state": "loading", "defaults": None}
        for p in pools
        if p.loading
    ]
    return {
        "pools": [
            {
                "state": "ready",
                "base_model_id": s.base_model_id,
                "model_id": s.engine.model_id,
                "family": s.family,
                "default": s.default,
                "defaults": defaults.get(s.base_model_id),
                "resident": s.memory.resident if s.memory is not None else None,
                "pipeline_bytes": s.memory.nbytes if s.memory is not None else None,
                "moves_in": s.memory.moves_in if s.memory is not None else None,
                "last_move_s": s.memory.last_move_s if s.memory is not None else None,
                "device": s.engine.device,
                "dtype": s.engine.dtype,
                "storage": s.engine.storage,
                "gguf_types": s.engine.gguf_types,
                "applied": list(s.engine.applied),
                "cached_adapters": len(s.engine.cached),
                "host_cache_bytes": s.engine.host_bytes,
                "device_cache_bytes": s.engine.device_bytes,
            }
            for s in statuses
        ]
        + loading
    }


def pools_api_snippets(url: str, pools: Sequence[ServedPool]) -> str:
    """The per-base forms: a LoRA picks its own base; without one, name the base."""
    lines = [
        "**Per base model.** A LoRA runs on the base it was made for; without a LoRA, name a served base "
        '(else the default). Python: `client.predict(..., base="<base repo id>", api_name="/generate")` '
        '(and `/compare`); `client.predict(api_name="/pool_status")` gives each pool\'s status. HTTP:'
    ]
    for pool in pools:
        defaults = pool.defaults
        sizes = f'"width": {defaults.side}, "height": {defaults.side}'
        # A video pool's answer is an MP4 (`serving.video`): its frames and rate are parameters too.
        video = f', "num_frames": {defaults.num_frames}, "fps": {defaults.fps}' if defaults.video else ""
        body = f'{{"inputs": "an elephant", "parameters": {{{sizes}{video}}}}}'
        lines.append(
            f"{display_name(pool.base_model_id)}: {defaults.steps} steps, {inputs_note(defaults)} by default; "
            f"sides in multiples of {defaults.side_multiple}."
        )
        out = "result.mp4" if defaults.video else "result.jpg"
        lines.append(f"```bash\ncurl {url.rstrip('/')}/models/{pool.base_model_id} \\\n     -d '{body}' > {out}\n```")
    lines.append("An unserved base answers 404 naming the served ones; LoRAs of two bases in one request, 400.")
    return "\n\n".join(lines)
