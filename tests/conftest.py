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

# FastAPI imports pydantic.v1 lazily, the first time a Gradio app builds its routes. In this CPython 3.11
# that first import, made while the suite's server threads are running, fails inside importlib
# ("KeyError: <thread id>" from _bootstrap's module-lock bookkeeping), so the module is imported once here,
# before any test starts a server.
import pydantic.v1  # noqa: F401
import pytest


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
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "pipeline")


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


@pytest.fixture(scope="session")
def loaded(base_settings):
    from engine.pipeline.loading import load_pipeline

    return load_pipeline(base_settings)


@pytest.fixture(scope="session")
def pristine(loaded) -> dict[str, object]:
    """Every parameter of the tiny pipeline as loaded, to check bit-exact restores against."""
    pipe = loaded.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("unet", "text_encoder", "text_encoder_2", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }


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
def tiny_sd15_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-sd15") / "pipeline", model_id="tiny-sd15")


@pytest.fixture(scope="session")
def loaded_sd15(tiny_sd15_dir: Path, base_settings):
    """The tiny SD 1.5 pipeline, loaded from its folder like a real one (a second pool beside `loaded`)."""
    from engine.pipeline.loading import load_pipeline
    from families.sd15 import MODEL_ID as SD15_MODEL_ID

    return load_pipeline(base_settings.replace(model_id=str(tiny_sd15_dir), base_model_id=SD15_MODEL_ID))


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-flux") / "pipeline", model_id="tiny-flux")


@pytest.fixture(scope="session")
def loaded_flux(tiny_flux_dir: Path, base_settings):
    """The tiny FLUX.1 [dev] pipeline, loaded from its folder like a real one (a third pool)."""
    from engine.pipeline.loading import load_pipeline
    from families.flux import MODEL_ID as FLUX_MODEL_ID

    return load_pipeline(base_settings.replace(model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID))


@pytest.fixture(scope="session")
def pristine_flux(loaded_flux) -> dict[str, object]:
    pipe = loaded_flux.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("transformer", "text_encoder", "text_encoder_2", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }


@pytest.fixture(scope="session")
def tiny_zimage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-zimage") / "pipeline", model_id="tiny-zimage")


@pytest.fixture(scope="session")
def loaded_zimage(tiny_zimage_dir: Path, base_settings):
    """The tiny Z-Image Turbo pipeline, loaded from its folder like a real one (a second DiT family)."""
    from engine.pipeline.loading import load_pipeline
    from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID

    return load_pipeline(base_settings.replace(model_id=str(tiny_zimage_dir), base_model_id=ZIMAGE_MODEL_ID))


@pytest.fixture(scope="session")
def pristine_zimage(loaded_zimage) -> dict[str, object]:
    pipe = loaded_zimage.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("transformer", "text_encoder", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }


@pytest.fixture(scope="session")
def tiny_flux2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-flux2") / "pipeline", model_id="tiny-flux2")


@pytest.fixture(scope="session")
def loaded_flux2(tiny_flux2_dir: Path, base_settings):
    """The tiny FLUX.2 [klein] 4B pipeline, loaded from its folder like a real one (the third DiT family)."""
    from engine.pipeline.loading import load_pipeline
    from families.flux2 import MODEL_ID

    return load_pipeline(base_settings.replace(model_id=str(tiny_flux2_dir), base_model_id=MODEL_ID))


@pytest.fixture(scope="session")
def pristine_flux2(loaded_flux2) -> dict[str, object]:
    pipe = loaded_flux2.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("transformer", "text_encoder", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }


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


@pytest.fixture(scope="session")
def pristine_sd15(loaded_sd15) -> dict[str, object]:
    pipe = loaded_sd15.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("unet", "text_encoder", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }


@pytest.fixture(scope="session")
def tiny_qwen_image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.families.tiny import ensure_tiny_pipeline

    return ensure_tiny_pipeline(tmp_path_factory.mktemp("tiny-qwen-image") / "pipeline", model_id="tiny-qwen-image")


@pytest.fixture(scope="session")
def loaded_qwen_image(tiny_qwen_image_dir: Path, base_settings):
    """The tiny Qwen-Image pipeline, loaded from its folder like a real one (a third DiT family)."""
    from engine.pipeline.loading import load_pipeline
    from families.qwen_image import MODEL_ID

    return load_pipeline(base_settings.replace(model_id=str(tiny_qwen_image_dir), base_model_id=MODEL_ID))


@pytest.fixture(scope="session")
def pristine_qwen_image(loaded_qwen_image) -> dict[str, object]:
    pipe = loaded_qwen_image.pipe
    return {
        f"{name}.{key}": value.detach().clone()
        for name in ("transformer", "text_encoder", "vae")
        for key, value in getattr(pipe, name).state_dict().items()
    }
