"""What the engine hands back: a prepared request, a checked LoRA, a pool and its status; the callback shapes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.caches.store import CachedAdapter
from engine.formats.adapters import PreparedAdapter
from engine.requests import AdapterUse, CheckedRequest, ModelDefaults

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "EngineStatus",
    "LoraCheck",
    "PoolMemory",
    "PoolStatus",
    "PreparedRequest",
    "Preview",
    "Progress",
    "ServedPool",
]

# (steps done, steps): called after every denoising step.
Progress = Callable[[int, int], None]
# (steps done, the image so far): called every `PREVIEW_EVERY` steps while denoising, never after the last.
Preview = Callable[[int, "Image"], None]


@dataclass(frozen=True)
class PreparedRequest:
    """A normalised request with its adapters ready in the host cache (leased until released)."""

    request: CheckedRequest
    # (adapter, scale, scale_2: its second stage's, None: `scale` there too)
    adapters: tuple[tuple[PreparedAdapter, float, float | None], ...]
    uses: tuple[AdapterUse, ...]
    resolve_s: float
    prepare_s: float
    warnings: tuple[str, ...]
    started: float


@dataclass(frozen=True)
class LoraCheck:
    """What checking one LoRA found: it loads, fits and is cached."""

    ref: str
    revision: str
    weight_name: str
    file_size: int
    rank: int
    layers: int
    components: tuple[str, ...]
    cache: str
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class EngineStatus:
    model_id: str
    base_model_id: str
    device: str
    dtype: str
    is_tiny: bool
    per_call: bool
    load_s: float
    warmup_s: float
    cached: tuple[CachedAdapter, ...]
    host_bytes: int
    host_budget: int
    device_bytes: int
    device_budget: int
    pristine_bytes: int
    pristine_budget: int
    applied: tuple[str, ...]
    preview: str = "off"
    # Requests in the engine's queue now (the running one excluded).
    waiting: int = 0
    # COMPILE: the mode ("off": eager), the start-up compile's seconds and shapes, and since then the denoiser's
    # recompiles (0 expected: a swap needs none) and calls of other shapes, which ran eager.
    compile_mode: str = "off"
    compile_s: float = 0.0
    compiled_shapes: int = 0
    recompiles: int = 0
    eager_calls: int = 0
    # The denoiser's weight storage (QUANTIZE): `native`, or `fp8` or `int4` with LoRAs as branches beside it;
    # `gguf` (a MODELS item's GGUF file, LoRAs as branches too), with its linears' quant types in `gguf_types`.
    storage: str = "native"
    gguf_types: str = ""


@dataclass(frozen=True)
class ServedPool:
    """One served base as every transport sees it, local or on a cluster: what the UI and the API offer for it."""

    base_model_id: str
    model_id: str
    family: str
    defaults: ModelDefaults
    default: bool
    # Still loading (the offline demo's background pools): listed, its `defaults` provisional (its family's), and a
    # request to it answered `PoolLoadingError` (503 with Retry-After) until it serves.
    loading: bool = False


@dataclass(frozen=True)
class PoolMemory:
    """One pool's place in device memory, as the status panel shows it."""

    name: str
    nbytes: int
    resident: bool
    in_use: int
    moves_in: int
    last_move_s: float


@dataclass(frozen=True)
class PoolStatus:
    """One pool's status: where its pipeline is (None when a cluster holds it) and its engine's status."""

    base_model_id: str
    family: str
    default: bool
    memory: PoolMemory | None
    engine: EngineStatus
