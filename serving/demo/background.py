"""The offline demo's background work (`DemoWork`), started once its page is up (`serving.runtime`): its later
pools loaded (each listed as loading till then: `serving.backends.growing`), their LoRAs written, then every demo
LoRA's preview rendered."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import SwitchboardError
from engine.pipeline.loading import LoadedPipeline
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import Settings
from lora_catalog.catalog import Catalog
from serving.backends.growing import GrowingBackend
from serving.demo.later_loras import LATER_LORAS, ensure_later_loras
from serving.demo.loras import DEMO_ALL, render_previews

__all__ = ["DemoWork"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoWork:
    """The demo's background work: its later pools loaded (each listed as loading till then), their LoRAs
    written, then every LoRA's preview rendered."""

    backend: GrowingBackend
    catalog: Catalog
    folder: Path
    stop: threading.Event
    later: Settings
    resolver: AdapterResolver
    load: Callable[..., LoadedPipeline]

    def run(self) -> None:
        if self.later.pools:
            self._load_later()
        try:
            render_previews(self.backend, self.folder, stop=self.stop, loras=(*DEMO_ALL, *LATER_LORAS))
        except (SwitchboardError, OSError) as e:
            logger.warning("could not render the demo previews in %s: %s", self.folder, e)
        self.catalog.rescan_local()

    def _load_later(self) -> None:
        started = time.perf_counter()
        bases = tuple(p.base_model_id for p in self.later.pools)
        try:
            pools = build_pools(self.later, self.resolver, self.load, warm=False)
            ensure_later_loras(self.folder, {p.base_model_id: p.engine.loaded.pipe for p in pools.pools})
        except Exception:
            # The demo still serves its image pools; these are no longer listed.
            logger.exception("the offline demo's background pools (%s) could not load", ", ".join(bases))
            self.backend.failed(bases)
            return
        if self.stop.is_set():
            # Closed while they loaded: put them back instead of serving them.
            pools.close()
            self.backend.failed(bases)
            return
        self.catalog.rescan_local()
        self.backend.add(pools)
        logger.info(
            "the offline demo now also serves %s (%.1f s in the background)",
            ", ".join(bases),
            time.perf_counter() - started,
        )
