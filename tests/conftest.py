"""Session-wide test setup: a stand-in Hub, a tiny SDXL pipeline and LoRA fixtures, all made here.

huggingface_hub reads HF_ENDPOINT once, when first imported, so the environment
is set at collection time, before any test module imports it (or diffusers, or gradio).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# FastAPI imports pydantic.v1 lazily, the first time a Gradio app builds its routes. In this CPython 3.11
# that first import, made while the suite's server threads are running, fails inside importlib
# ("KeyError: <thread id>" from _bootstrap's module-lock bookkeeping), so the module is imported once here,
# before any test starts a server.
import pydantic.v1  # noqa: F401
import pytest

from families import Family
from tests.support.tiny import TINY_FAMILIES


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


HUB_PORT = _free_port()
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{HUB_PORT}"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hf-home-")
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["HF_HUB_ETAG_TIMEOUT"] = "5"
os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = "5"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ.pop("HF_TOKEN", None)


# Test folders whose files share one package-scoped fixture (tests/reliability/app: one launched app;
# tests/serving/tiny_ltx2: one tiny LTX-2 Space); xdist keeps each on one worker, which then launches it once.
ONE_WORKER_PACKAGES = ("tests/reliability/app/", "tests/serving/tiny_ltx2/")
# Files of one test over the families (parametrised `<family>` or `<family>-<case>`): each family's tests are a unit
# of their own, so the families' share spreads over the workers.
BY_FAMILY_FILES = ("tests/engine/families/test_swaps.py", "tests/engine/pools/test_pools_mixed.py")
# The units that take longest, longest first (a full run's junit times summed per unit, 2 AMD EPYC cores, each over
# 15 s of a worker's time): handed out before the rest, so the two workers end together. xdist's own order is by
# test count, which left units of one to four long tests (test_start, test_browser_images, test_longrun) for the
# tail while the other worker sat idle. A unit missing here only runs later; a name that no longer exists is skipped.
FIRST_UNITS = (
    "tests/serving/test_browser.py",
    "tests/reliability/app/",
    "tests/engine/pipeline/test_compiled.py",
    "tests/serving/test_start.py",
    "tests/engine/pipeline/test_scheduler_options.py",
    "tests/reliability/test_zerogpu.py",
    "tests/reliability/test_requests.py",
    "tests/engine/pools/test_pools.py",
    "tests/engine/pipeline/test_controls.py",
    "tests/bench/test_gpu_check.py",
    "tests/engine/formats/test_formats.py",
    "tests/engine/pipeline/test_image_modes.py",
    "tests/test_layering.py",
    "tests/bench/test_smoke.py",
    "tests/engine/weights/test_pivotal.py",
    "tests/engine/pools/test_runtime.py",
    "tests/engine/weights/test_quantized_families.py",
    "tests/serving/test_browser_images.py",
    "tests/bench/test_fleet.py",
    "tests/serving/test_runtime.py",
    "tests/engine/families/test_references_flux2.py",
    "tests/reliability/test_longrun.py",
    "tests/engine/weights/test_swap.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile`, but with each of ONE_WORKER_PACKAGES one unit of work, as a file is, each family's
    tests in BY_FAMILY_FILES one unit, and FIRST_UNITS handed out first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PackageScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            package = next((p for p in ONE_WORKER_PACKAGES if nodeid.startswith(p)), None)
            path, _, rest = nodeid.partition("::")
            if path in BY_FAMILY_FILES and "[" in rest:
                return f"{path}::{rest.split('[', 1)[1].split('-', 1)[0].rstrip(']')}"
            return package or super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            first = next((unit for unit in FIRST_UNITS if unit in self.workqueue), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return PackageScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def tiny_edit_conditions() -> Iterator[None]:
    """diffusers' Qwen-Image-Edit pipelines condition on a small input image for the session, ours and the
    references alike (tests/support/tiny.py's TINY_CONDITION_AREA: a test size, not the 1 MP of the real model)."""
    from tests.support.tiny import small_edit_conditions

    with pytest.MonkeyPatch.context() as patch:
        small_edit_conditions(patch)
        yield


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.support.standin_hub import StandInHub

    with StandInHub(root=tmp_path_factory.mktemp("standin-hub"), port=HUB_PORT) as started:
        yield started


@pytest.fixture
def clean_hub(hub) -> Iterator[object]:
    """The `hub` in scope (a module may serve its own), with no fault and an empty request log, left faultless."""
    hub.set_fault(None)
    hub.clear_requests()
    yield hub
    hub.set_fault(None)


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.tiny import TinyFolders

    return TinyFolders(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_models(tiny_folders, base_settings):
    """Every tiny family's folder, loaded pipeline and pristine weights (tests/support/tiny.py), on first use."""
    from tests.support.tiny import TinyModels

    return TinyModels(tiny_folders, base_settings)


def _tiny_fixtures(family: Family) -> dict[str, object]:
    """`tiny_<family>_dir`, `loaded_<family>` and `pristine_<family>`: one family's parts of the factory."""

    def folder(tiny_folders) -> Path:
        return tiny_folders(family)

    def loaded(tiny_models):
        return tiny_models.loaded(family)

    def pristine(tiny_models) -> dict[str, object]:
        return tiny_models.pristine(family)

    return {
        f"tiny_{family.value}_dir": pytest.fixture(folder, scope="session", name=f"tiny_{family.value}_dir"),
        f"loaded_{family.value}": pytest.fixture(loaded, scope="session", name=f"loaded_{family.value}"),
        f"pristine_{family.value}": pytest.fixture(pristine, scope="session", name=f"pristine_{family.value}"),
    }


for _family in TINY_FAMILIES:
    globals().update(_tiny_fixtures(_family))


# The default pool's (SDXL's) under the short names most tests use.
@pytest.fixture(scope="session")
def tiny_dir(tiny_sdxl_dir: Path) -> Path:
    return tiny_sdxl_dir


@pytest.fixture(scope="session")
def loaded(loaded_sdxl):
    return loaded_sdxl


@pytest.fixture(scope="session")
def pristine(pristine_sdxl) -> dict[str, object]:
    """Every parameter of the tiny SDXL pipeline as loaded, to check bit-exact restores against."""
    return pristine_sdxl


@pytest.fixture(scope="session")
def fixtures(hub, tmp_path_factory: pytest.TempPathFactory):
    from engine.families.sdxl import build_tiny_pipeline
    from tests.support.loras import publish_fixtures

    return publish_fixtures(hub, build_tiny_pipeline(), tmp_path_factory.mktemp("local-loras"))


@pytest.fixture(scope="session")
def pivotal(hub, tmp_path_factory: pytest.TempPathFactory):
    """Pivotal-tuning repos (LoRA + embeddings file + card) on the stand-in Hub, and local pairs."""
    from engine.families.sdxl import build_tiny_pipeline
    from tests.support.loras import publish_pivotal

    return publish_pivotal(hub, build_tiny_pipeline(), tmp_path_factory.mktemp("pivotal-local"))


@pytest.fixture(scope="session")
def base_settings(tiny_dir: Path, fixtures):
    from engine.settings import Settings

    return Settings(
        model_id=str(tiny_dir),
        base_model_id="stabilityai/stable-diffusion-xl-base-1.0",
        device="cpu",
        dtype="float32",
        max_rank=32,
        local_lora_dir=fixtures.local_dir,
        host_cache_bytes=64 * 2**20,
        device_cache_bytes=64 * 2**20,
    )


@pytest.fixture
def make_engine(loaded, base_settings, hub) -> Iterator[Callable[..., object]]:
    """Build engines over the session's pipeline; each is closed (base restored) after the test."""
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.hub import HubSource

    made = []

    def build(**overrides: object):
        settings = base_settings.replace(**overrides)
        resolver = AdapterResolver(
            HubSource(endpoint=hub.url, token=settings.hf_token, timeout_s=settings.hub_timeout_s),
            local_dir=settings.local_lora_dir,
            token=settings.hf_token,
            max_bytes=settings.max_adapter_bytes,
        )
        engine = Engine(loaded, settings, resolver)
        made.append(engine)
        return engine

    yield build
    # Engines share one pipeline, each snapshotting pristine weights as it first touches them:
    # close the newest first so every engine restores the state it found.
    for engine in reversed(made):
        engine.close()


@pytest.fixture
def engine(make_engine):
    return make_engine()


@pytest.fixture(scope="session")
def demo_load(loaded, loaded_sd15, loaded_flux) -> Callable[..., object]:
    """A loader for `build_runtime`'s offline demo: the session's tiny SDXL, SD 1.5 and FLUX pipelines, one per
    pool."""
    from engine.settings import TINY_MODEL_ID
    from families.flux import TINY_ID as TINY_FLUX_MODEL_ID
    from families.sd15 import TINY_ID as TINY_SD15_MODEL_ID

    pipelines = {TINY_MODEL_ID: loaded, TINY_SD15_MODEL_ID: loaded_sd15, TINY_FLUX_MODEL_ID: loaded_flux}

    def load(settings, warm: bool = True):
        return pipelines[settings.model_id]

    return load
