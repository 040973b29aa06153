"""`Engine`: one pool's warm pipeline, its adapter store, its scheduler, and an atomic swap-and-generate.

A request is queued on the engine's scheduler (`engine.pools.scheduler`: one queue for every transport), which
prepares it (`_open`: resolved, downloaded, converted) off the GPU's path and admits it when its adapters are
ready; the one caller holding the slot (`serving.backends.local.LocalBackend`) then calls `run` (swap and
inference under the lock). Gallery-click prefetches prepare in a lane of their own (`engine.pools.prefetch`),
never in a queued request's way. Any failure leaves the weights exactly as the last successful request left them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

from engine.caches.disk import DiskCache
from engine.errors import HubUnavailableError, InvalidRequestError, PreparationError, SwitchboardError
from engine.events import EngineEvents
from engine.formats.adapters import AdapterKey, PreparedAdapter
from engine.formats.pivotal import check_clashes
from engine.limits import Limits
from engine.normalise import normalise_request
from engine.outcomes import EngineStatus, LoraCheck, PreparedRequest, Preview, Progress
from engine.pipeline.inference import engine_error, infer, made
from engine.pipeline.loading import LoadedPipeline
from engine.pipeline.preview import load_preview_decoder
from engine.pipeline.schedulers import check_scheduler, run_pipeline
from engine.pipeline.sharing import device_ahead_s, pool_turn
from engine.pools.parts import build_parts
from engine.pools.prefetch import PrefetchLane
from engine.pools.report import engine_status
from engine.pools.scheduler import Scheduler
from engine.prepare.preparation import Lane, PreparedLora
from engine.prepare.resolve import AdapterResolver
from engine.recommended import final_request
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from engine.result_parts import AdapterUse, Timings
from engine.settings import Settings
from engine.weights.fused import FusedSet, set_identity, stepped_weights
from engine.weights.tokens import TokenPatcher
from lora_catalog.hints import LoraHints

__all__ = ["Engine", "EngineStatus", "LoraCheck", "PreparedRequest", "Preview", "Progress"]

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        loaded: LoadedPipeline,
        settings: Settings,
        resolver: AdapterResolver,
        *,
        disk_cache: DiskCache | None = None,
        host_pristine: int | None = None,
    ) -> None:
        """One pool's engine; `disk_cache` is the Hub cache's pruner when pools share one (else made here);
        `host_pristine`: what the memory plan left in host RAM for its pristine copies there (HOST_RAM_BYTES)."""
        self.loaded = loaded
        self.settings = settings
        self.resolver = resolver
        self._per_call = settings.per_call
        # Subscribers (serving.http.metrics) count what the engine reports here; the engine keeps no counts itself.
        self.events = EngineEvents()
        parts = build_parts(loaded, settings, resolver, self.events, disk_cache=disk_cache, host_pristine=host_pristine)
        self._table = parts.table
        self._store = parts.store
        self._pristine_budget = parts.pristine_budget
        self.pristine_device_bytes = parts.pristine_device_bytes
        self.scratch_device_bytes = parts.scratch_device_bytes
        self.disk_cache = parts.disk_cache
        self._preparer = parts.preparer
        self._limits = Limits.of(settings)
        # The pipeline lock: uncontended under the scheduler, it keeps a direct `run` call safe too.
        self._lock = threading.Lock()
        # The one place where the weights change (through `WeightPatcher`).
        self._fused = FusedSet(
            parts.patcher,
            TokenPatcher(parts.encoders),
            self._store,
            per_call=self._per_call,
            device=loaded.device,
            on_swap=self.events.swapped,
            denoiser=stepped_weights(parts.table.names, loaded.family.stored),
        )
        self.scheduler: Scheduler[PreparedRequest] = Scheduler(
            prepare=self._open,
            identity=lambda prepared: set_identity(prepared.adapters),
            fused=self._fused.identity,
            max_queue=settings.max_queue,
            max_skip=settings.affinity_max_skip,
            # One preparation per queued request, and room for some still finishing (loads: bounded by the gate).
            threads=settings.max_queue + settings.prepare_workers,
            mode=settings.scheduler,
            device_ahead=partial(device_ahead_s, loaded),
        )
        self._prefetches = PrefetchLane(partial(self._open, lane="prefetch"), pending=settings.max_queue)
        self._preview = load_preview_decoder(settings, loaded.family, loaded.device, loaded.dtype)

    @property
    def defaults(self) -> ModelDefaults:
        """The served model's request defaults (size, steps, guidance)."""
        return self.loaded.defaults

    @property
    def limits(self) -> Limits:
        """What one request may ask for (LoRAs, steps, prompt length)."""
        return self._limits

    @property
    def base_model_id(self) -> str:
        """The base model LoRAs are checked against."""
        return self.loaded.base_model_id

    # -- preparing -------------------------------------------------------------------------------

    @contextmanager
    def prepare(self, request: GenerateRequest) -> Iterator[PreparedRequest]:
        """Validate the request and make its adapters ready; they stay leased inside the block."""
        prepared, release = self._open(request)
        try:
            yield prepared
        finally:
            release()

    def check(self, request: GenerateRequest) -> CheckedRequest:
        """The request checked as this pool runs it, its scheduler built from the pool's config (no I/O, no
        weights): what a transport refuses before queueing it. The one check a request gets: `LocalBackend`
        queues what this returns, and preparing a `CheckedRequest` takes it as checked here."""
        checked = normalise_request(request, self.loaded.defaults, self._limits)
        check_scheduler(checked, self.loaded.pipe.scheduler)
        return checked

    def prefetch(self, spec: LoraSpec) -> concurrent.futures.Future[None]:
        """Start preparing one LoRA into the cache (a gallery click) in the prefetch lane, behind every queued
        request (`engine.pools.prefetch`): the later request is a cache hit. Cancel the future to drop it."""
        return self._prefetches.submit(self._lora_only("prefetch", spec))

    def _lora_only(self, prompt: str, spec: LoraSpec) -> GenerateRequest:
        """A request that only prepares `spec` (a check, a prefetch), with the family's placeholder image."""
        side = self.loaded.defaults.side
        return GenerateRequest(prompt=prompt, loras=(spec,), image=self.loaded.family.placeholder_image(side, side))

    def _open(self, request: GenerateRequest, *, lane: Lane = "request") -> tuple[PreparedRequest, Callable[[], None]]:
        """Validate the request (unless this pool's `check` made it) and make its adapters ready, leased until the
        returned release is called."""
        started = time.perf_counter()
        normalised = request if isinstance(request, CheckedRequest) else self.check(request)
        leased: list[AdapterKey] = []
        try:
            adapters: list[tuple[PreparedAdapter, float, float | None]] = []
            uses: list[AdapterUse] = []
            warnings: list[str] = []
            hints: list[LoraHints] = []
            trained: list[tuple[str, str | None]] = []  # each IC-LoRA's reference downscale, as its file says
            resolve_s = prepare_s = 0.0
            for spec in normalised.loras:
                ready = self._prepare_one(spec, leased, lane)
                adapter = ready.adapter
                if any(a.key == adapter.key for a, *_ in adapters):
                    # Two specs can name one file (a branch and its sha, an explicit default file name).
                    raise InvalidRequestError(
                        f"LoRA {spec.ref!r} is listed twice (both name {adapter.key}); "
                        "accepted: each LoRA once, with one scale"
                    )
                self.events.cache_lookup("host", ready.cache == "hit")
                resolve_s, prepare_s = resolve_s + ready.resolve_s, prepare_s + ready.prepare_s
                adapters.append((adapter, spec.scale, spec.scale_2))
                key = adapter.key
                uses.append(
                    AdapterUse(
                        spec.ref,
                        key.revision,
                        key.weight_name,
                        spec.scale,
                        ready.cache,
                        adapter.file_hash,
                        ready.trained_for,
                        spec.scale_2,
                        adapter.files,
                    )
                )
                warnings.extend((*adapter.warnings, *ready.warnings))
                hints.append(ready.hints)
                trained.append((f"LoRA {spec.ref!r} (file {key.weight_name!r})", adapter.trained_downscale))
            check_clashes((use.ref, adapter.embeddings) for (adapter, *_), use in zip(adapters, uses, strict=True))
            final, ignored, notes = final_request(normalised, hints, self.loaded.defaults, self._limits, trained)
            if (final.scheduler, final.scheduler_options) != (normalised.scheduler, normalised.scheduler_options):
                check_scheduler(final, self.loaded.pipe.scheduler)  # the LoRAs' sampler, with the client's options
            normalised = final
            warnings[:0] = ignored
            warnings.extend(notes)
            self.events.prepared(time.perf_counter() - started)
            prepared = PreparedRequest(
                normalised, tuple(adapters), tuple(uses), resolve_s, prepare_s, tuple(warnings), started
            )
        except BaseException as e:
            if isinstance(e, HubUnavailableError):
                self.events.hub_error(type(e).__name__)
            self._store.release(leased)
            raise
        return prepared, lambda: self._store.release(leased)

    def _prepare_one(self, spec: LoraSpec, leased: list[AdapterKey], lane: Lane) -> PreparedLora:
        try:
            return self._preparer.adapter(spec, leased, lane=lane)
        except SwitchboardError:
            raise
        except Exception as e:
            # A library failing in a way nobody mapped is still an answer every transport can give
            # (JSON on `POST /`, a gr.Error in the UI): "the request failed" and an id, which the log carries
            # beside the traceback.
            raise PreparationError.unforeseen(e, logger, f"preparing LoRA {spec.ref!r}") from e

    def check_lora(self, spec: LoraSpec) -> LoraCheck:
        """Resolve, download and prepare one LoRA without generating (the UI's custom-LoRA check)."""
        with self.prepare(self._lora_only("check", spec)) as prepared:
            (adapter, *_), use = prepared.adapters[0], prepared.uses[0]
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

    def hold(self, keys: Iterable[AdapterKey]) -> None:
        """Keep these prepared adapters cached until `let_go` (an outside cache, e.g. Ray Serve's, owns them)."""
        self._store.lease(keys)

    def let_go(self, keys: Iterable[AdapterKey]) -> None:
        """End a `hold`: the adapters leave the cache as soon as no request or swap uses them."""
        keys = tuple(keys)
        self._store.release(keys)
        self._store.forget(keys)

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        prepared: PreparedRequest,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """Swap to the request's adapters and generate, atomically; on failure restore what was served. Callers
        hold the scheduler's slot (`LocalBackend`, the one caller); the lock only keeps a direct call safe."""
        with self._lock:
            return self._run_held(prepared, progress, cancel, preview)

    def run_many(
        self,
        prepared: Sequence[PreparedRequest],
        *,
        progress: Callable[[int, int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[GenerateResult, ...]:
        """Several requests in one turn on the pipeline (a comparison grid): each swapped to exactly, in order.

        Each result is what `run` gives for its request alone: the swap between them is the same exact one.
        The caller holds one scheduler slot for all of them. `progress(cell, step, steps)` counts cells from 0.
        """
        results: list[GenerateResult] = []
        with self._lock:
            for cell, one in enumerate(prepared):
                step_progress = None if progress is None else partial(progress, cell)
                results.append(self._run_held(one, step_progress, cancel, None))
        return tuple(results)

    def _run_held(
        self,
        prepared: PreparedRequest,
        progress: Progress | None,
        cancel: threading.Event | None,
        preview: Preview | None,
    ) -> GenerateResult:
        locked = time.perf_counter()
        # From queued (preparation started) to this slot: what a client waited before its swap.
        self.events.queue_waited(locked - prepared.started)
        previous = self._fused.applied
        try:
            swapped, apply_s = self._fused.swap(prepared.adapters)
            pipe = run_pipeline(self.loaded.pipe, prepared.request, self.loaded.family)
            with pool_turn(self, pipe, prepared.request, cancel, progress) as boundary:
                inferred = time.perf_counter()
                drawn = infer(
                    pipe,
                    prepared.request,
                    family=self.loaded.family,
                    tokenizers=self._fused.tokenizers,
                    progress=progress,
                    cancel=cancel,
                    decoder=self._preview,
                    preview_every=self.settings.preview_every,
                    preview=preview,
                    at_step=self._fused.stepper(prepared.request.loras, prepared.adapters),
                    boundary=boundary,
                )
        except BaseException as e:
            self._fused.rollback(previous)
            mapped = engine_error(e, prepared.request)
            if mapped is e:
                raise
            raise mapped from e
        finally:
            self._fused.after_call()
        timings = self._finished(prepared, locked, inferred, apply_s, len(drawn.pictures))
        return GenerateResult(
            **made(drawn, prepared.request),
            seed=prepared.request.seed,
            request=prepared.request,
            timings=timings,
            adapters=prepared.uses,
            swapped=swapped,
            warnings=prepared.warnings,
            model_id=self.loaded.model_name,
        )

    def _finished(
        self, prepared: PreparedRequest, locked: float, inferred: float, apply_s: float, images: int
    ) -> Timings:
        """The request's timings, reported and logged, once its images are made."""
        done = time.perf_counter()
        self.events.inferred(done - inferred)
        timings = Timings(
            resolve=prepared.resolve_s,
            prepare=prepared.prepare_s,
            apply=apply_s,
            inference=done - inferred,
            total=done - prepared.started,
        )
        logger.info(
            "generated %d× %dx%d in %d steps (%s) with %s: apply %.1f ms, inference %.2f s, total %.2f s "
            "(waited %.2f s)",
            images,
            prepared.request.width,
            prepared.request.height,
            prepared.request.steps,
            prepared.request.sampler,
            ", ".join(str(a.key) for a, *_ in prepared.adapters) or "no LoRA",
            apply_s * 1000,
            timings.inference,
            timings.total,
            locked - prepared.started - prepared.resolve_s - prepared.prepare_s,
        )
        return timings

    @property
    def waiting(self) -> int:
        """Requests waiting for the pipeline right now (the one running excluded)."""
        return self.scheduler.waiting

    def close(self) -> None:
        """Refuse new requests, drop waiting prefetches and put the base weights back (the pipeline may outlive
        this engine)."""
        self.scheduler.close()
        self._prefetches.close()
        self.restore_base_weights()

    def restore_base_weights(self) -> None:
        """Put the base weights back now; the engine keeps serving (the next request fuses its own set)."""
        with self._lock:
            self._fused.restore_all()

    def prepare_to_leave_device(self) -> None:
        """Restore the base weights and drop the pristine copies (before the pipeline leaves the device).

        The next request fuses its own set again, so a pool moved out and back serves bit-exactly.
        """
        with self._lock:
            self._fused.restore_all()
            self._fused.forget_pristine()

    def adapters_in_use(self) -> set[AdapterKey]:
        """Adapters leased or fused here (a shared disk cache keeps their files)."""
        return self._store.in_use()

    def status(self) -> EngineStatus:
        return engine_status(
            self.loaded,
            self._store,
            self._fused,
            per_call=self._per_call,
            pristine_budget=self._pristine_budget,
            preview=self._preview.name if self._preview is not None else "off",
            waiting=self.scheduler.waiting,
        )
