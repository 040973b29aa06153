"""The engine: one warm pipeline, an adapter store, and an atomic swap-and-generate.

A request is prepared (resolved, downloaded, converted; outside the pipeline
lock, so a slow download does not hold up other users) and then run (swap and
inference under the lock). Any failure leaves the weights exactly as the last
successful request left them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .adapters import COMPONENTS, AdapterKey, PreparedAdapter, TargetTable
from .disk_cache import DiskCache
from .errors import (
    EngineBusyError,
    GenerationCancelledError,
    GenerationError,
    InvalidRequestError,
    PreparationError,
    SwitchboardError,
)
from .pipeline import LoadedPipeline
from .preparation import PreparedLora, Preparer
from .requests import (
    AdapterUse,
    CheckedRequest,
    GenerateRequest,
    GenerateResult,
    Limits,
    LoraSpec,
    ModelDefaults,
    Timings,
    normalise_request,
)
from .resolve import AdapterResolver
from .settings import Settings
from .store import AdapterStore, CachedAdapter
from .swap import ActiveAdapter, WeightPatcher

__all__ = ["Engine", "EngineStatus", "LoraCheck", "PreparedRequest"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PreparedRequest:
    """A normalised request with its adapters ready in the host cache (leased until released)."""

    request: CheckedRequest
    adapters: tuple[tuple[PreparedAdapter, float], ...]
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
    applied: tuple[str, ...]


class Engine:
    def __init__(self, loaded: LoadedPipeline, settings: Settings, resolver: AdapterResolver) -> None:
        self.loaded = loaded
        self.settings = settings
        self._per_call = settings.per_call
        pipe = loaded.pipe
        self._table = TargetTable({c: getattr(pipe, c) for c in COMPONENTS})
        on_device = loaded.device.type != "cpu" and not self._per_call and settings.pristine_store != "cpu"
        # On ZeroGPU the main process must not touch CUDA, and pinning host memory does: nothing pins there.
        pin = loaded.device.type == "cuda" and not settings.zero_gpu
        self._patcher = WeightPatcher(
            self._table.params,
            loaded.device if on_device else torch.device("cpu"),
            budget=settings.pristine_bytes,
            pin=pin,
        )
        self._store = AdapterStore(
            host_budget=settings.host_cache_bytes,
            device_budget=settings.device_cache_bytes,
            device=loaded.device,
            dtype=loaded.dtype,
            # On the CPU the host copy is the compute copy; on ZeroGPU device memory does not outlive a call.
            use_device_tier=loaded.device.type != "cpu" and not self._per_call,
            pin=pin,
        )
        self.disk_cache = (
            DiskCache(
                settings.disk_cache_bytes,
                cache_dir=resolver.cache_dir,
                # The budget is for LoRAs: the served model's own repos are never pruned.
                keep_repos={settings.model_id, settings.base_model_id, loaded.model_id, settings.vae_id or ""},
                in_use=self._store.in_use,
            )
            if resolver.uses_hub
            else None
        )
        self._preparer = Preparer(
            resolver,
            self._store,
            self._table,
            served_base=loaded.base_model_id,
            unet_config=pipe.unet.config,
            max_rank=settings.max_rank,
            disk=self.disk_cache,
        )
        self._limits = Limits(settings.max_loras, settings.max_steps, settings.max_prompt_chars)
        self._lock = threading.Lock()
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._applied: tuple[ActiveAdapter, ...] = ()

    @property
    def defaults(self) -> ModelDefaults:
        """The served model's request defaults (size, steps, guidance)."""
        return self.loaded.defaults

    @property
    def base_model_id(self) -> str:
        """The base model LoRAs are checked against."""
        return self.loaded.base_model_id

    # -- preparing -------------------------------------------------------------------------------

    @contextmanager
    def prepare(self, request: GenerateRequest) -> Iterator[PreparedRequest]:
        """Validate the request and make its adapters ready; they stay leased inside the block."""
        started = time.perf_counter()
        normalised = normalise_request(request, self.loaded.defaults, self._limits)
        leased: list[AdapterKey] = []
        try:
            adapters: list[tuple[PreparedAdapter, float]] = []
            uses: list[AdapterUse] = []
            warnings: list[str] = []
            resolve_s = prepare_s = 0.0
            for spec in normalised.loras:
                ready = self._prepare_one(spec, leased)
                adapter = ready.adapter
                if any(a.key == adapter.key for a, _ in adapters):
                    # Two specs can name one file (a branch and its sha, an explicit default file name).
                    raise InvalidRequestError(
                        f"LoRA {spec.ref!r} is listed twice (both name {adapter.key}); "
                        "accepted: each LoRA once, with one scale"
                    )
                resolve_s, prepare_s = resolve_s + ready.resolve_s, prepare_s + ready.prepare_s
                adapters.append((adapter, spec.scale))
                key = adapter.key
                uses.append(AdapterUse(spec.ref, key.revision, key.weight_name, spec.scale, ready.cache))
                warnings.extend((*adapter.warnings, *ready.warnings))
            yield PreparedRequest(
                normalised, tuple(adapters), tuple(uses), resolve_s, prepare_s, tuple(warnings), started
            )
        finally:
            self._store.release(leased)

    def _prepare_one(self, spec: LoraSpec, leased: list[AdapterKey]) -> PreparedLora:
        try:
            return self._preparer.adapter(spec, leased)
        except SwitchboardError:
            raise
        except Exception as e:
            # A library failing in a way nobody mapped is still an answer every transport can give
            # (JSON on `POST /`, a gr.Error in the UI), and is logged with its traceback for us.
            logger.exception("preparing LoRA %r failed unexpectedly", spec.ref)
            raise PreparationError(f"LoRA {spec.ref!r} could not be prepared: {type(e).__name__}: {e}") from e

    def check_lora(self, spec: LoraSpec) -> LoraCheck:
        """Resolve, download and prepare one LoRA without generating (the UI's custom-LoRA check)."""
        with self.prepare(GenerateRequest(prompt="check", loras=(spec,))) as prepared:
            (adapter, _), use = prepared.adapters[0], prepared.uses[0]
            return LoraCheck(
                ref=use.ref,
                revision=use.revision,
                weight_name=use.weight_name,
                file_size=adapter.file_size,
                rank=adapter.max_rank,
                layers=len(adapter.layers),
                components=adapter.components,
                cache=use.cache,
                warnings=prepared.warnings,
            )

    # -- running ---------------------------------------------------------------------------------

    def generate(
        self, request: GenerateRequest, *, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> GenerateResult:
        with self.prepare(request) as prepared:
            return self.run(prepared, progress=progress, cancel=cancel)

    def run(
        self, prepared: PreparedRequest, *, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> GenerateResult:
        """Swap to the request's adapters and generate, atomically; on failure restore what was served."""
        with self._queued(cancel):
            locked = time.perf_counter()
            previous = self._applied
            try:
                swapped, apply_s = self._swap(prepared)
                inferred = time.perf_counter()
                image = self._infer(prepared.request, progress, cancel)
            except BaseException as e:
                self._rollback(previous)
                mapped = _engine_error(e, prepared.request)
                if mapped is e:
                    raise
                raise mapped from e
            finally:
                if self._per_call:
                    self._patcher.restore_all()
                    self._applied = ()
            done = time.perf_counter()
        timings = Timings(
            resolve=prepared.resolve_s,
            prepare=prepared.prepare_s,
            apply=apply_s,
            inference=done - inferred,
            total=done - prepared.started,
        )
        logger.info(
            "generated %dx%d in %d steps with %s: apply %.1f ms, inference %.2f s, total %.2f s (waited %.2f s)",
            prepared.request.width,
            prepared.request.height,
            prepared.request.steps,
            ", ".join(str(a.key) for a, _ in prepared.adapters) or "no LoRA",
            apply_s * 1000,
            timings.inference,
            timings.total,
            locked - prepared.started - prepared.resolve_s - prepared.prepare_s,
        )
        return GenerateResult(
            image=image,
            seed=prepared.request.seed,
            request=prepared.request,
            timings=timings,
            adapters=prepared.uses,
            swapped=swapped,
            warnings=prepared.warnings,
        )

    @contextmanager
    def _queued(self, cancel: threading.Event | None) -> Iterator[None]:
        with self._waiting_lock:
            if self._waiting >= self.settings.max_queue:
                raise EngineBusyError(
                    f"the engine is busy ({self._waiting} requests waiting, limit {self.settings.max_queue}); "
                    "try again shortly"
                )
            self._waiting += 1
        try:
            while not self._lock.acquire(timeout=0.05):
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelledError("the request was cancelled while waiting in the queue")
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def _swap(self, prepared: PreparedRequest) -> tuple[bool, float]:
        wanted = sorted(prepared.adapters, key=lambda item: (str(item[0].key), item[1]))
        identity = tuple((a.key, s) for a, s in wanted)
        if not self._per_call and identity == tuple((a.adapter.key, a.scale) for a in self._applied):
            return False, 0.0
        if not wanted and not self._patcher.dirty:
            return False, 0.0
        started = time.perf_counter()
        active = tuple(ActiveAdapter(self._store.for_compute(a), s) for a, s in wanted)
        self._patcher.apply(active)
        self._synchronize()
        elapsed = time.perf_counter() - started
        logger.info(
            "swap %s -> %s: %d layers in %.1f ms",
            _describe(self._applied),
            _describe(active),
            sum(len(a.adapter.layers) for a in active),
            elapsed * 1000,
        )
        self._applied = active
        self._store.set_active(a.adapter.key for a in active)
        return True, elapsed

    def _rollback(self, previous: tuple[ActiveAdapter, ...]) -> None:
        try:
            self._patcher.apply(previous)
            self._applied = previous
        except BaseException:
            logger.exception("could not re-apply %s after a failure; serving the base model", _describe(previous))
            self._patcher.restore_all()
            self._applied = ()
        self._store.set_active(a.adapter.key for a in self._applied)

    @torch.inference_mode()
    def _infer(self, request: CheckedRequest, progress: Progress | None, cancel: threading.Event | None):
        steps = request.steps

        def on_step(pipe, step: int, timestep, callback_kwargs: dict) -> dict:
            if cancel is not None and cancel.is_set():
                # Raised, not `pipe._interrupt`: an interrupted diffusers pipeline still runs the VAE decode,
                # the most expensive single step at SDXL sizes, for an image nobody will see.
                raise GenerationCancelledError("the request was cancelled during generation")
            if progress is not None:
                progress(step + 1, steps)
            return callback_kwargs

        output = self.loaded.pipe(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt or None,
            num_inference_steps=steps,
            guidance_scale=request.guidance,
            width=request.width,
            height=request.height,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            callback_on_step_end=on_step,
            output_type="pil",
        )
        if cancel is not None and cancel.is_set():
            raise GenerationCancelledError("the request was cancelled during generation")
        return output.images[0]

    def _synchronize(self) -> None:
        if self.loaded.device.type == "cuda":
            torch.cuda.synchronize(self.loaded.device)

    @property
    def waiting(self) -> int:
        """Requests waiting for the pipeline right now (the one running excluded)."""
        with self._waiting_lock:
            return self._waiting

    def close(self) -> None:
        """Put the base weights back (the pipeline may outlive this engine)."""
        with self._lock:
            self._patcher.restore_all()
            self._applied = ()
            self._store.set_active(())

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> EngineStatus:
        host_budget, device_budget = self._store.budgets
        return EngineStatus(
            model_id=self.loaded.model_id,
            base_model_id=self.loaded.base_model_id,
            device=str(self.loaded.device),
            dtype=str(self.loaded.dtype).removeprefix("torch."),
            is_tiny=self.loaded.is_tiny,
            per_call=self._per_call,
            load_s=self.loaded.load_s,
            warmup_s=self.loaded.warmup_s,
            cached=tuple(self._store.snapshot()),
            host_bytes=self._store.host_bytes,
            host_budget=host_budget,
            device_bytes=self._store.device_bytes,
            device_budget=device_budget,
            pristine_bytes=self._patcher.pristine_bytes,
            applied=tuple(f"{a.adapter.key}×{a.scale:g}" for a in self._applied),
        )


def _describe(active: tuple[ActiveAdapter, ...]) -> str:
    return "[" + ", ".join(f"{a.adapter.key.name}×{a.scale:g}" for a in active) + "]"


def _engine_error(error: BaseException, request: CheckedRequest) -> BaseException:
    if isinstance(error, SwitchboardError):
        return error
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return GenerationError(
            f"out of memory generating {request.width}x{request.height}; try a smaller size or fewer LoRAs"
        )
    if isinstance(error, Exception):
        return GenerationError(f"generation failed: {type(error).__name__}: {error}")
    return error
