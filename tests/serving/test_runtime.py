"""Start-up wiring: what gets served with and without MODEL_ID, a GPU and the Hub; the offline demo's LoRAs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PIL import Image

from engine.errors import SettingsError
from engine.requests import GenerateRequest, InputImage, LoraSpec
from engine.settings import DEFAULT_MODEL_ID, Settings
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from lora_catalog.sft_header import read_header
from serving.demo.example import EXAMPLE_IMAGE, EXAMPLE_PROMPT, EXAMPLE_STRENGTH
from serving.demo.loras import DEMO_FLUX_LORAS, DEMO_LORAS, DEMO_SD15_LORAS, ensure_demo_loras
from serving.runtime import build_runtime, plan_start, probe_base
from tests.support.checks import generate

NO_PROBE_WANTED = "the Hub probe must not run here"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory):
    """One demo folder for the module, so its previews are rendered once."""
    return tmp_path_factory.mktemp("demo")


def never_probe(settings: Settings) -> str | None:
    raise AssertionError(NO_PROBE_WANTED)


def test_an_explicit_model_id_is_served_as_is_without_probing():
    settings = Settings.from_env({"MODEL_ID": "someone/sdxl-finetune"})
    plan = plan_start(settings, cuda=lambda: False, probe=never_probe)
    assert plan.demo is False
    assert plan.settings.model_id == "someone/sdxl-finetune"


def test_explicit_tiny_is_the_demo_and_says_why():
    plan = plan_start(Settings.from_env({"MODEL_ID": "tiny"}), cuda=lambda: True, probe=never_probe)
    assert plan.demo is True
    assert plan.reason == "MODEL_ID=tiny is set"


def test_the_default_without_a_gpu_is_the_demo_without_asking_the_hub():
    plan = plan_start(Settings.from_env({}), cuda=lambda: False, probe=never_probe)
    assert plan.demo is True
    assert plan.settings.model_id == "tiny"
    assert plan.settings.base_model_id == DEFAULT_MODEL_ID
    assert plan.reason == "no CUDA GPU was found"


def test_the_default_with_a_gpu_serves_sdxl_only_when_its_weights_can_be_had():
    settings = Settings.from_env({})
    assert plan_start(settings, cuda=lambda: True, probe=lambda s: None).settings.model_id == DEFAULT_MODEL_ID
    offline = plan_start(settings, cuda=lambda: True, probe=lambda s: "the Hub could not be reached")
    assert offline.demo is True
    assert offline.reason == "the Hub could not be reached"


def test_probe_base_asks_the_hub_for_model_index(hub, fixtures):
    hub.add_repo("probe-tests/tiny-base", {"model_index.json": b'{"_class_name": "StableDiffusionXLPipeline"}'})
    assert probe_base(Settings(model_id="probe-tests/tiny-base", hub_timeout_s=5)) is None
    assert "HTTP 404" in (probe_base(Settings(model_id=fixtures["peft"], hub_timeout_s=5)) or "")
    hub.set_fault("down", paths="probe-tests")
    try:
        reason = probe_base(Settings(model_id="probe-tests/tiny-base", hub_timeout_s=5))
    finally:
        hub.set_fault(None)
    assert reason is not None
    assert "could not be reached" in reason


def test_an_explicit_model_that_cannot_load_stops_start_up(tmp_path):
    def broken(settings: Settings, warm: bool = True):
        raise OSError("no such folder")

    settings = Settings.from_env({"MODEL_ID": str(tmp_path / "missing")})
    with pytest.raises(SettingsError, match=r"MODEL_ID='.*missing' could not be loaded: no such folder"):
        build_runtime(settings, demo_dir=tmp_path, load=broken)


def test_demo_loras_carry_titles_triggers_and_licences(tmp_path, loaded):
    paths = ensure_demo_loras(tmp_path, loaded.pipe)
    assert [p.name for p in paths] == [lora.file_name for lora in DEMO_LORAS]
    metadata = read_header(paths[2]).metadata
    assert metadata["modelspec.title"] == "Neon Static"
    assert metadata["modelspec.trigger_phrase"] == "neon static"
    assert metadata["modelspec.license"] == "cc-by-nc-4.0"
    written = [p.stat().st_mtime_ns for p in paths]
    assert ensure_demo_loras(tmp_path, loaded.pipe) == paths
    assert [p.stat().st_mtime_ns for p in paths] == written


def test_the_offline_demo_serves_its_own_loras_with_previews(demo_dir, demo_load, loaded_sd15, loaded_flux):
    loads: list[Settings] = []

    def load(settings: Settings, warm: bool = True):
        loads.append(settings)
        return demo_load(settings, warm)

    # The pools it loads in the background have a test of their own (test_demo_background.py).
    runtime = build_runtime(Settings.from_env({}), demo_dir=demo_dir, cuda=lambda: False, load=load, later=())
    try:
        assert runtime.wait_ready(timeout=600)
        assert [s.model_id for s in loads] == ["tiny", "tiny-sd15", "tiny-flux"]
        bases = (DEFAULT_MODEL_ID, SD15_MODEL_ID, FLUX_MODEL_ID)
        assert tuple(p.base_model_id for p in runtime.backend.pools()) == bases
        assert runtime.demo is True
        assert "tiny random-weight model" in (runtime.banner or "")
        assert "no CUDA GPU was found" in (runtime.banner or "")
        assert "MODEL_ID" in (runtime.banner or "")
        page = runtime.catalog.page(DEFAULT_MODEL_ID)
        assert sorted(e.title for e in page.entries) == sorted(lora.title for lora in DEMO_LORAS)
        assert all(e.preview_urls and e.trigger_words for e in page.entries)
        assert {e.title for e in page.entries if e.non_commercial} == {"Neon Static", "Aurora Veil"}
        plain = generate(runtime.backend, GenerateRequest(prompt="a fox", seed=3))
        styled = generate(
            runtime.backend, GenerateRequest(prompt="a fox", seed=3, loras=(LoraSpec(page.entries[0].ref),))
        )
        assert plain.image.tobytes() != styled.image.tobytes()
        # The SD 1.5 pool's LoRAs are listed under its base, and run on its pipeline.
        sd15_page = runtime.catalog.page(SD15_MODEL_ID)
        assert sorted(e.title for e in sd15_page.entries) == sorted(lora.title for lora in DEMO_SD15_LORAS)
        assert all(e.preview_urls for e in sd15_page.entries)
        on_sd15 = generate(
            runtime.backend, GenerateRequest(prompt="a fox", seed=3, loras=(LoraSpec(sd15_page.entries[0].ref),))
        )
        assert on_sd15.adapters[0].ref == sd15_page.entries[0].ref
        assert on_sd15.image.size == (loaded_sd15.defaults.side, loaded_sd15.defaults.side)
        # The FLUX pool's: one file per naming (kohya with a CLIP part, diffusers, XLabs, ComfyUI), each routed to
        # the FLUX pool by its own evidence and changing its image.
        flux_page = runtime.catalog.page(FLUX_MODEL_ID)
        assert sorted(e.title for e in flux_page.entries) == sorted(lora.title for lora in DEMO_FLUX_LORAS)
        assert all(e.preview_urls for e in flux_page.entries)
        flux_base = generate(runtime.backend, GenerateRequest(prompt="a fox", seed=3), base=FLUX_MODEL_ID)
        for entry in flux_page.entries:
            on_flux = generate(runtime.backend, GenerateRequest(prompt="a fox", seed=3, loras=(LoraSpec(entry.ref),)))
            assert on_flux.image.size == (loaded_flux.defaults.side,) * 2
            assert on_flux.image.tobytes() != flux_base.image.tobytes(), entry.title
    finally:
        runtime.close()
    again = build_runtime(Settings.from_env({}), demo_dir=demo_dir, cuda=lambda: False, load=load, later=())
    try:
        assert again.preview_thread is None
    finally:
        again.close()


def test_the_offline_demo_starts_from_its_example_image_on_each_pool(demo_dir, demo_load):
    """The example the UI offers (serving/demo/example.png) runs image-to-image on every demo pool, with a LoRA."""
    runtime = build_runtime(Settings.from_env({}), demo_dir=demo_dir, cuda=lambda: False, load=demo_load)
    try:
        assert runtime.wait_ready(timeout=600)
        with Image.open(EXAMPLE_IMAGE) as bundled:
            example = InputImage.from_pil(bundled)
        for pool in runtime.backend.pools():
            side = pool.defaults.side
            asked = GenerateRequest(prompt=EXAMPLE_PROMPT, seed=3, width=side, height=side)
            plain = generate(runtime.backend, asked, base=pool.base_model_id)
            lora = LoraSpec(runtime.catalog.page(pool.base_model_id).entries[0].ref)
            started = replace(asked, image=example, strength=EXAMPLE_STRENGTH, loras=(lora,))
            made = generate(runtime.backend, started)
            assert (made.request.mode, made.request.strength) == ("image-to-image", EXAMPLE_STRENGTH), pool.family
            assert made.image.size == (side, side) and made.adapters[0].ref == lora.ref
            assert made.image.tobytes() != plain.image.tobytes(), pool.family
    finally:
        runtime.close()


def test_a_default_sdxl_that_fails_to_load_falls_back_to_the_demo(demo_dir, demo_load):
    def load(settings: Settings, warm: bool = True):
        if not settings.loads_tiny:
            raise OSError("disk full")
        return demo_load(settings, warm)

    runtime = build_runtime(
        Settings.from_env({}), demo_dir=demo_dir, cuda=lambda: True, probe=lambda s: None, load=load
    )
    try:
        runtime.wait_ready(timeout=300)
        assert runtime.demo is True
        assert f"loading {DEFAULT_MODEL_ID} failed (OSError: disk full)" in (runtime.banner or "")
    finally:
        runtime.close()


def test_closing_the_demo_stops_its_previews_and_restores_the_base(tmp_path, loaded, demo_load, pristine):
    runtime = build_runtime(Settings.from_env({}), demo_dir=tmp_path, cuda=lambda: False, load=demo_load)
    runtime.close()
    assert runtime.preview_thread is not None
    assert not runtime.preview_thread.is_alive()
    for name in ("unet", "text_encoder", "text_encoder_2"):
        for key, value in getattr(loaded.pipe, name).state_dict().items():
            assert value.equal(pristine[f"{name}.{key}"]), f"{name}.{key} was left patched"
