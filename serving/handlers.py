"""What the UI and the named API both do, written once: list a page, check a LoRA, generate.

The Gradio UI (`app.py`) and the API (`serving.ui.gradio_api`) differ only in how they take their inputs and
format their outputs; each calls these methods, so a request follows one path whichever door it came in by.
Errors are the tree's (`lora_catalog.errors`); the callers turn them into answers with `serving.errors`.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL.Image import Image

from engine.compare import MAX_COMPARE_LORAS, CompareRequest, CompareResult
from engine.requests import GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import SwitchboardError
from lora_catalog.hub import check_sort
from lora_catalog.listing import CatalogPage
from serving.streaming import Frame, Preview, stream
from serving.ui.grid import grid_image

if TYPE_CHECKING:
    from engine.pools.engine import Engine, EngineStatus, LoraCheck
    from engine.pools.pools import Pools, PoolStatus
    from engine.pools.scheduler import QueueView
    from lora_catalog.catalog import Catalog
    from serving.backends.remote import RemoteEngine, RemoteRunner
    from serving.runtime import GpuRunner

__all__ = ["PAGE_SIZE", "Comparison", "Handlers", "LoraReport"]

PAGE_SIZE = 24
_FALLBACK_EXAMPLE = "minimaxir/sdxl-wrong-lora"

Progress = Callable[[int, int], None]
CellProgress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class LoraReport:
    """A LoRA as the catalogue describes it and as the engine found it (loads, fits, cached)."""

    entry: LoraEntry
    check: LoraCheck


@dataclass(frozen=True)
class Comparison:
    """A comparison's cells and the labelled grid drawn from them."""

    result: CompareResult
    grid: Image


class Handlers:
    """The one implementation of each user action, over the default engine, the runner and the catalogue.

    With a local runner, `pools` are its pools: checks and prefetches go to a LoRA's own pool, and a request
    without a LoRA may name its base (`base`). A front end (`RemoteRunner`) has none here.
    """

    def __init__(
        self,
        engine: Engine | RemoteEngine,
        catalog: Catalog,
        runner: GpuRunner | RemoteRunner,
        *,
        boot_s: float | None = None,
    ) -> None:
        self._engine = engine
        self._catalog = catalog
        self._runner = runner
        self.pools: Pools | None = runner.pools
        self.boot_s = boot_s

    @property
    def defaults(self) -> ModelDefaults:
        return self._engine.defaults

    @property
    def served_base(self) -> str:
        return self._engine.base_model_id

    @property
    def max_steps(self) -> int:
        return self._engine.settings.max_steps

    @property
    def compare_limits(self) -> tuple[int, int, int]:
        """(LoRAs, cells, steps over all cells) one comparison may hold."""
        settings = self._engine.settings
        return MAX_COMPARE_LORAS, settings.max_compare_cells, settings.max_compare_steps

    @property
    def max_queue(self) -> int:
        return self._engine.settings.max_queue

    def page(self, base: str, search: str, sort: str, page: int) -> CatalogPage:
        """One page of LoRAs for `base` ("" for the served one)."""
        return self._catalog.page(
            base or self.served_base,
            search=search or "",
            sort=check_sort(sort or "downloads"),
            page=page,
            page_size=PAGE_SIZE,
        )

    def defaults_for(self, base: str) -> ModelDefaults:
        """The request defaults of the pool serving `base` ("" or an unserved base: the default pool's)."""
        if self.pools is None or not base:
            return self.defaults
        pool = next((p for p in self.pools.pools if p.base_model_id.lower() == base.lower()), self.pools.default)
        return pool.engine.defaults

    def lora(self, spec: LoraSpec) -> LoraReport:
        """What a LoRA is and whether it loads here, on its own pool (downloads and prepares it: the next use is
        a cache hit)."""
        entry = self._catalog.resolve(spec.ref, spec.revision, spec.weight_name)
        check = self.pools.check_lora(spec) if self.pools is not None else self._engine.check_lora(spec)
        return LoraReport(entry, check)

    async def generate(
        self,
        request: GenerateRequest,
        progress: Progress | None = None,
        *,
        cancel: threading.Event | None = None,
        on_queue: Callable[[QueueView], None] | None = None,
        transport: str = "gradio_api",
        preview: Preview | None = None,
        base: str = "",
    ) -> GenerateResult:
        """The one way the UI and the API generate: routed to its pool (`base` names one for a request without
        a LoRA, "" for the default), queued on that pool's scheduler, prepared off the GPU's path, then swapped
        and run in the GPU function; waiting holds no thread.

        How it ended is reported to the engine's events under `transport` (metrics count requests by it).
        """
        events = self._engine.events
        try:
            result = await self._runner.generate_async(
                request, base=base, progress=progress, cancel=cancel, on_queue=on_queue, preview=preview
            )
        except SwitchboardError as e:
            events.request_done(transport, e.status)
            raise
        except Exception:
            events.request_done(transport, 500)
            raise
        events.request_done(transport, 200)
        return result

    def prefetch(self, spec: LoraSpec) -> concurrent.futures.Future[None]:
        """Start preparing a LoRA the user picked on its pool, so that Generate finds it ready.

        Routing it may look it up on the Hub first: async callers run this in a worker thread."""
        return self.pools.prefetch(spec) if self.pools is not None else self._engine.prefetch(spec)

    def generate_stream(
        self,
        request: GenerateRequest,
        progress: Progress | None = None,
        *,
        on_queue: Callable[[QueueView], None] | None = None,
        transport: str = "gradio_api",
        base: str = "",
    ) -> AsyncIterator[Frame | GenerateResult | None]:
        """`generate`, yielding preview frames while it denoises (none when previews are off) and `None` ticks
        while it waits, then the result; closing the stream cancels the generation."""
        cancel = threading.Event()

        def work(preview: Preview) -> Awaitable[GenerateResult]:
            return self.generate(
                request, progress, cancel=cancel, on_queue=on_queue, transport=transport, preview=preview, base=base
            )

        return stream(work, cancel)

    async def compare(
        self,
        request: CompareRequest,
        progress: CellProgress | None = None,
        base: str = "",
        on_queue: Callable[[QueueView], None] | None = None,
    ) -> Comparison:
        """A comparison grid: every cell in one queue turn on the LoRAs' pool (else `base`'s), then the grid.

        The queue is awaited (no thread held while waiting, as for `generate`)."""
        result = await self._runner.compare_async(request, base=base, progress=progress, on_queue=on_queue)
        return Comparison(result, grid_image(result.labels, [r.image for r in result.results]))

    def status(self) -> EngineStatus:
        return self._engine.status()

    def pool_status(self) -> tuple[PoolStatus, ...] | None:
        """Each pool's status (None for a front end, whose cluster reports its own)."""
        return self.pools.status() if self.pools is not None else None

    def example_lora(self) -> str:
        """A LoRA to show in the API snippets: the best-known Hub one if any, else whatever is listed first."""
        try:
            entries = self.page("", "", "downloads", 0).entries
        except SwitchboardError:
            entries = ()
        hub = [e for e in entries if e.source == "hub"]
        return (hub or list(entries))[0].ref if entries else _FALLBACK_EXAMPLE
