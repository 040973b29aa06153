"""One tiny LTX-2 Space for the tests of an IC-LoRA's reference video through its doors (`POST /`, gradio_client,
InferenceClient, the browser): the app as `app.main` starts it from `MODELS=tiny-ltx2` without a GPU, its catalogue
holding an IC-LoRA made here; started once for this package (xdist keeps the package on one worker:
tests/conftest.py's ONE_WORKER_PACKAGES) instead of once per module. Its refusals are small to send: a frame of
64 x 64 at most (MAX_INPUT_PIXELS' least), 17 frames at most."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.families.tiny_ltx2 import build_tiny_pipeline
from tests.support.app_server import AppServer, served_runtime
from tests.support.ltx2 import write_ic_lora

ENVIRONMENT = {"MODELS": "tiny-ltx2", "MAX_INPUT_PIXELS": "4096", "MAX_VIDEO_FRAMES": "17"}


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    folder = tmp_path_factory.mktemp("tiny-ltx2")
    # Before the runtime starts: its local catalogue is read from this folder then (the factors' shapes are the
    # tiny pipeline's, whatever its weights).
    write_ic_lora(build_tiny_pipeline(), folder)
    with served_runtime(ENVIRONMENT, folder) as (_, served):
        yield served
