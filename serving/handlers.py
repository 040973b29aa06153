"""What every transport does, written once: list a page, check a LoRA, prefetch, generate, compare, status.

The Gradio UI (`app.py`, `serving.ui`), the named API (`serving.ui.gradio_api`) and `POST /` (`serving.http.api`)
differ only in how they take their inputs and format their outputs; each calls these methods over one `Backend`
(`serving.backends`: this process's pools, or a cluster) and the catalogue, so a request follows one path
whichever door it came in by. How each generation ended is reported once, here, by transport. Errors are the
tree's (`lora_catalog.errors`); the callers turn them into answers with `serving.errors`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL.Image import Image

from engine.compare import MAX_COMPARE_LORAS, CompareRequest, CompareResult
from engine.errors import GenerationCancelledError
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from lora_catalog.catalog import Catalog, check_listing_source
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import SwitchboardError
from lora_catalog.hub import check_sort
from lora_catalog.listing import CatalogPage
from serving.grid import grid_image
from serving.recipes import with_recipes
from serving.streaming import Frame, Preview, stream
from serving.video import without_recipes

if TYPE_CHECKING:
    from engine.outcomes import LoraCheck, PoolStatus, ServedPool
    from engine.settings import Settings
    from serving.backends import Backend, CellProgress, OnQueue

__all__ = ["PAGE_SIZE", "Comparison", "Handlers", "LoraReport"]

PAGE_SIZE = 24
_FALLBACK_EXAMPLE = "minimaxir/sdxl-wrong-lora"

Progress = Callable[[int, int], None]


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
    """The one implementation of each user action, over one backend, the catalogue and the Space's settings."""

    def __init__(self, backend: Backend, catalog: Catalog, settings: Settings, *, boot_s: float | None = None) -> None:
        self.backend = backend
        self._catalog = catalog
        self.settings = settings
        self.boot_s = boot_s

    @property
    def pools(self) -> tuple[ServedPool, ...]:
        """The served pools, the default first."""
        return self.backend.pools()

    @property
    def default(self) -> ServedPool:
        return self.pools[0]

    @property
    def compare_limits(self) -> tuple[int, int, int]:
        """(LoRAs, cells, steps over all cells) one comparison may hold."""
        return MAX_COMPARE_LORAS, self.settings.max_compare_cells, self.settings.max_compare_steps

    @property
    def civitai(self) -> bool:
        """Whether the catalogue has Civitai beside the Hub (its tab in the browser, Civitai references)."""
        return self._catalog is not None and self._catalog.civitai is not None

    def page(self, base: str, search: str, sort: str, page: int, source: str = "hub") -> CatalogPage:
        """One page of LoRAs for `base` ("" for the default pool's), from the Hub or (`source="civitai"`) Civitai."""
        return self._catalog.page(
            base or self.default.base_model_id,
            search=search or "",
            sort=check_sort(sort or "downloads"),
            page=page,
            page_size=PAGE_SIZE,
            source=check_listing_source(source or "hub"),
        )

    async def lora(self, spec: LoraSpec) -> LoraReport:
        """What a LoRA is and whether it loads here, on its own pool (downloads and prepares it: the next use is
        a cache hit)."""
        entry = self._catalog.resolve(spec.ref, spec.revision, spec.weight_name)
        return LoraReport(entry, await self.backend.check(spec))

    async def prefetch(self, spec: LoraSpec) -> None:
        """Prepare a LoRA the user picked on its pool, so that Generate finds it ready."""
        await self.backend.prefetch(spec)

    async def generate(
        self,
        request: GenerateRequest,
        progress: Progress | None = None,
        *,
        on_queue: OnQueue | None = None,
        transport: str = "gradio_api",
        preview: Preview | None = None,
        base: str = "",
    ) -> GenerateResult:
        """The one way every transport generates: on the backend (routed to the pool its LoRAs were made for, else
        `base`'s, else the default; queued; prepared off the GPU's path; swapped and run). Waiting holds no
        thread; cancelling the task cancels the request. How it ended is reported under `transport`."""
        try:
            result = await self.backend.generate(
                request, base=base, on_queue=on_queue, progress=progress, preview=preview
            )
        except SwitchboardError as e:
            self.report(transport, e.status)
            raise
        except asyncio.CancelledError:
            self.report(transport, GenerationCancelledError.status)
            raise
        except Exception:
            self.report(transport, 500)
            raise
        self.report(transport, 200)
        # Every transport's images carry their recipe (A1111's `parameters`), unless RECIPES=0; then neither does a
        # cluster's MP4, whose replica wrote the recipe by its own RECIPES (taken out off the event loop).
        if self.settings.recipes:
            return with_recipes(result)
        return await asyncio.to_thread(without_recipes, result) if result.video else result

    def report(self, transport: str, status: int) -> None:
        """Count how a request of `transport` ended (a transport refusing one before it reaches `generate` too)."""
        self.backend.events.request_done(transport, status)

    def generate_stream(
        self,
        request: GenerateRequest,
        progress: Progress | None = None,
        *,
        on_queue: OnQueue | None = None,
        transport: str = "gradio_api",
        base: str = "",
    ) -> AsyncGenerator[Frame | GenerateResult | None, None]:
        """`generate`, yielding preview frames while it denoises (none when previews are off) and `None` ticks
        while it waits, then the result; closing the stream cancels the generation."""

        def work(preview: Preview) -> Awaitable[GenerateResult]:
            return self.generate(request, progress, on_queue=on_queue, transport=transport, preview=preview, base=base)

        return stream(work)

    async def compare(
        self,
        request: CompareRequest,
        progress: CellProgress | None = None,
        base: str = "",
        on_queue: OnQueue | None = None,
    ) -> Comparison:
        """A comparison grid: every cell in one queue turn on the LoRAs' pool (else `base`'s), then the grid."""
        result = await self.backend.compare(request, base=base, on_queue=on_queue, progress=progress)
        if self.settings.recipes:
            result = dataclasses.replace(result, results=tuple(with_recipes(r) for r in result.results))
        return Comparison(result, grid_image(result.labels, [r.image for r in result.results]))

    async def status(self) -> tuple[PoolStatus, ...]:
        """Each pool's status, the default first."""
        return await self.backend.status()

    def example_lora(self) -> str:
        """A LoRA to show in the API snippets: the best-known Hub one if any, else whatever is listed first."""
        try:
            entries = self.page("", "", "downloads", 0).entries
        except SwitchboardError:
            entries = ()
        hub = [e for e in entries if e.source == "hub"]
        return (hub or list(entries))[0].ref if entries else _FALLBACK_EXAMPLE
