"""What the UI and the named API both do, written once: list a page, check a LoRA, generate.

The Gradio UI (`app.py`) and the API (`serving.gradio_api`) differ only in how they take their inputs and
format their outputs; each calls these methods, so a request follows one path whichever door it came in by.
Errors are the tree's (`lora_catalog.errors`); the callers turn them into answers with `serving.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL.Image import Image

from engine.compare import MAX_COMPARE_LORAS, CompareRequest, CompareResult
from engine.requests import GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import SwitchboardError
from lora_catalog.listing import CatalogPage
from serving.grid import grid_image
from serving.streaming import Frame, stream

if TYPE_CHECKING:
    from engine.service import Engine, EngineStatus, LoraCheck
    from lora_catalog.catalog import Catalog
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
    """The one implementation of each user action, over one engine, its runner and the catalogue."""

    def __init__(self, engine: Engine, catalog: Catalog, runner: GpuRunner, *, boot_s: float | None = None) -> None:
        self._engine = engine
        self._catalog = catalog
        self._runner = runner
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
            base or self.served_base, search=search or "", sort=sort or "downloads", page=page, page_size=PAGE_SIZE
        )

    def lora(self, spec: LoraSpec) -> LoraReport:
        """What a LoRA is and whether it loads here (downloads and prepares it: the next use is a cache hit)."""
        entry = self._catalog.resolve(spec.ref, spec.revision, spec.weight_name)
        return LoraReport(entry, self._engine.check_lora(spec))

    def generate(self, request: GenerateRequest, progress: Progress | None = None) -> GenerateResult:
        """The one way a transport generates: through the runner (prepared outside the GPU function, run in it)."""
        return self._runner.generate(request, progress=progress)

    def generate_stream(
        self, request: GenerateRequest, progress: Progress | None = None
    ) -> Iterator[Frame | GenerateResult]:
        """`generate`, yielding preview frames while it denoises (none when previews are off), then the result."""
        return stream(
            lambda preview, cancel: self._runner.generate(request, progress=progress, cancel=cancel, preview=preview)
        )

    def compare(self, request: CompareRequest, progress: CellProgress | None = None) -> Comparison:
        """A comparison grid: every cell in one queue turn, then the labelled grid image."""
        result = self._runner.compare(request, progress=progress)
        return Comparison(result, grid_image(result.labels, [r.image for r in result.results]))

    def status(self) -> EngineStatus:
        return self._engine.status()

    def example_lora(self) -> str:
        """A LoRA to show in the API snippets: the best-known Hub one if any, else whatever is listed first."""
        try:
            entries = self.page("", "", "downloads", 0).entries
        except SwitchboardError:
            entries = ()
        hub = [e for e in entries if e.source == "hub"]
        return (hub or list(entries))[0].ref if entries else _FALLBACK_EXAMPLE
