"""What the UI and the named API both do, written once: list a page, check a LoRA, generate.

The Gradio UI (`app.py`) and the API (`serving.gradio_api`) differ only in how they take their inputs and
format their outputs; each calls these methods, so a request follows one path whichever door it came in by.
Errors are the tree's (`lora_catalog.errors`); the callers turn them into answers with `serving.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.requests import GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import SwitchboardError
from lora_catalog.hub import check_sort
from lora_catalog.listing import CatalogPage

if TYPE_CHECKING:
    from engine.service import Engine, EngineStatus, LoraCheck
    from lora_catalog.catalog import Catalog
    from serving.runtime import GpuRunner

__all__ = ["PAGE_SIZE", "Handlers", "LoraReport"]

PAGE_SIZE = 24
_FALLBACK_EXAMPLE = "minimaxir/sdxl-wrong-lora"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LoraReport:
    """A LoRA as the catalogue describes it and as the engine found it (loads, fits, cached)."""

    entry: LoraEntry
    check: LoraCheck


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

    def lora(self, spec: LoraSpec) -> LoraReport:
        """What a LoRA is and whether it loads here (downloads and prepares it: the next use is a cache hit)."""
        entry = self._catalog.resolve(spec.ref, spec.revision, spec.weight_name)
        return LoraReport(entry, self._engine.check_lora(spec))

    def generate(
        self, request: GenerateRequest, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> GenerateResult:
        """The one way a transport generates: through the runner (prepared outside the GPU function, run in it)."""
        return self._runner.generate(request, progress=progress, cancel=cancel)

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
