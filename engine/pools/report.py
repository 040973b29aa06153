"""One pool engine's status (`engine.pools.engine.Engine.status`): its model, caches, fused set and compile."""

from __future__ import annotations

from typing import Any

from engine.caches.store import AdapterStore
from engine.outcomes import EngineStatus
from engine.pipeline.aot import AotDenoiser
from engine.pipeline.compiled import CompiledDenoiser
from engine.pipeline.loading import LoadedPipeline
from engine.weights.fused import FusedSet

__all__ = ["engine_status"]


def engine_status(
    loaded: LoadedPipeline,
    store: AdapterStore,
    fused: FusedSet,
    *,
    per_call: bool,
    pristine_budget: int,
    preview: str,
    waiting: int,
) -> EngineStatus:
    """What one pool serves and holds right now; `preview` names its preview decoder ("off" without one)."""
    host_budget, device_budget = store.budgets
    return EngineStatus(
        model_id=loaded.model_id,
        base_model_id=loaded.base_model_id,
        device=str(loaded.device),
        dtype=str(loaded.dtype).removeprefix("torch."),
        is_tiny=loaded.is_tiny,
        per_call=per_call,
        load_s=loaded.load_s,
        warmup_s=loaded.warmup_s,
        cached=tuple(store.snapshot()),
        host_bytes=store.host_bytes,
        host_budget=host_budget,
        device_bytes=store.device_bytes,
        device_budget=device_budget,
        pristine_bytes=fused.pristine_bytes,
        pristine_budget=pristine_budget,
        applied=tuple(f"{a.adapter.key}×{a.scale:g}" for a in fused.applied),
        preview=preview,
        waiting=waiting,
        storage=loaded.storage,
        gguf_types=loaded.gguf_types,
        **_compile_status(loaded.compiled),
    )


def _compile_status(compiled: CompiledDenoiser | AotDenoiser | None) -> dict[str, Any]:
    if compiled is None:
        return {}
    return {
        "compile_mode": compiled.mode,
        "compile_s": compiled.compile_s,
        "compiled_shapes": compiled.shapes,
        "recompiles": compiled.recompiles,
        "eager_calls": compiled.eager_calls,
    }
