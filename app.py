"""LoRA Switchboard: the Gradio UI, its named API, and one server that also answers inference-API POSTs.

Thin on purpose: the UI is `serving.ui.blocks.build_demo` (which the cluster's ingress builds too). Nothing is
loaded at import; `main()` builds the runtime (`serving.runtime.build_runtime`) and serves it
(`serving.ui.launch.serve`).
"""

from __future__ import annotations

import logging
import os

# On ZeroGPU `spaces` must come before anything that initialises CUDA; elsewhere it is cheap and inert.
import spaces  # noqa: F401

from serving.handlers import Handlers
from serving.ui.blocks import build_demo

__all__ = ["build_demo", "main"]

logger = logging.getLogger(__name__)


def main() -> None:
    from serving.quiet_logs import quiet_known_warnings

    # Before the libraries are imported (below): their known, harmless start-up warnings are dropped, so that the
    # start log shows the app's own lines first (each filter says why its message is harmless).
    quiet_known_warnings()
    from engine.errors import SettingsError
    from engine.settings import Settings
    from serving.http.api import http_routes
    from serving.runtime import build_runtime
    from serving.ui.launch import serve

    try:
        settings = Settings.from_env(os.environ)
        logging.basicConfig(level=settings.log_level_number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # The demo's background work (its later pools, previews) starts once the page is up: on two cores it would
        # slow the page's own start.
        runtime = build_runtime(settings, background=False)
    except SettingsError as e:
        raise SystemExit(f"LoRA Switchboard cannot start: {e}") from e
    handlers = Handlers(runtime.backend, runtime.catalog, runtime.settings, boot_s=runtime.boot_s)
    demo = build_demo(handlers, banner=runtime.banner, hub_url=runtime.hub_url)
    serve(
        demo,
        http_routes(handlers, metrics=settings.metrics),
        server_name=settings.server_name,
        server_port=settings.server_port,
        allowed_paths=[str(d) for d in runtime.local_dirs],
        max_file_size=settings.max_body_bytes,
        max_pixels=settings.max_input_pixels,
        block=False,
    )
    runtime.start_background()
    demo.block_thread()


if __name__ == "__main__":
    main()
