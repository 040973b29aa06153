"""The engine status panel's text: model, device, weights, compile, cache use (Markdown)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.storage import QUANTIZED_ORDER

if TYPE_CHECKING:
    from engine.pools.engine import EngineStatus

__all__ = ["status_markdown"]

_MIB = 2**20

# The status line's note on a denoiser whose LoRAs run as branches beside its stored weights, by its storage.
_WEIGHTS = {"gguf": " · **weights** GGUF {1}, LoRAs as branches"} | {
    s: " · **weights** {0}, LoRAs as branches (QUANTIZE)" for s in QUANTIZED_ORDER
}


def status_markdown(status: EngineStatus, boot_s: float | None = None) -> str:
    """The engine status panel: model, device, cache use, cold boot, ZeroGPU mode."""
    cold = f"{status.load_s + status.warmup_s:.1f} s (load {status.load_s:.1f} s + warm-up {status.warmup_s:.1f} s)"
    lines = [
        f"**Model** `{status.model_id}`" + (" — the tiny offline demo model" if status.is_tiny else ""),
        f"**Base** `{status.base_model_id}` · **device** `{status.device}` · **dtype** `{status.dtype}`"
        + _WEIGHTS.get(status.storage, "").format(status.storage, status.gguf_types),
        "**ZeroGPU mode** " + ("on: LoRAs are re-applied in every call" if status.per_call else "off"),
        f"**Live preview** {status.preview}",
        f"**Cold boot** {cold}" + (f" · whole start-up {boot_s:.1f} s" if boot_s is not None else ""),
        _compile_line(status),
        f"**Applied now** {', '.join(f'`{a}`' for a in status.applied) or 'nothing (base weights)'}",
        f"**Adapter cache** host {status.host_bytes / _MIB:.1f} / {status.host_budget / _MIB:.0f} MiB · "
        f"device {status.device_bytes / _MIB:.1f} / {status.device_budget / _MIB:.0f} MiB · "
        f"pristine copies {status.pristine_bytes / _MIB:.1f} / {status.pristine_budget / _MIB:.0f} MiB",
    ]
    if status.cached:
        rows = "\n".join(
            f"| `{c.key}` | {c.host_bytes / _MIB:.2f} | {c.device_bytes / _MIB:.2f} | {'✓' if c.active else ''} |"
            for c in status.cached
        )
        lines.append(f"| cached adapter | host MiB | device MiB | active |\n|---|---:|---:|:-:|\n{rows}")
    return "\n\n".join(lines)


def _compile_line(status: EngineStatus) -> str:
    if status.compile_mode == "off":
        return "**Compiled** no: the denoiser runs eager (`COMPILE=off`)"
    return (
        f"**Compiled** `{status.compile_mode}`: {status.compiled_shapes} shapes in {status.compile_s:.1f} s "
        f"(part of the warm-up) · recompiles since {status.recompiles} · other shapes run eager {status.eager_calls}×"
    )
