"""The demo on a quantized pool in a real browser (issue 31): `MODELS=tiny-flux QUANTIZE=fp8` starts as the app
does, its FLUX.1 transformer loaded in fp8 with LoRAs as branches beside it (bf16 compute: on a CPU it runs, only
slower); a user picks a LoRA, generates, and the status panel and `/pool_status` say fp8."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from PIL import Image

from tests.support.app_server import AppServer, served_runtime
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, browser, page, tile
from tests.support.clients import api_client

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def quantized_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """The app as `MODELS=tiny-flux QUANTIZE=fp8` starts it on a machine without a GPU (the real loader)."""
    # LORA_MAX_RANK=8: the demo LoRAs' ranks (4 and 8) fit, and the tiny layers' branch buffers stay small. Ready
    # once the demo LoRAs' previews are rendered on the quantized pool (the gallery shows them).
    environment = {"MODELS": "tiny-flux", "QUANTIZE": "fp8", "LORA_MAX_RANK": "8"}
    with served_runtime(environment, tmp_path_factory.mktemp("quantized-demo"), banner=True) as (_, served):
        yield served


@pytest.mark.timeout(900)
def test_a_user_generates_with_a_lora_on_the_quantized_flux_demo(page, quantized_demo):
    from playwright.sync_api import expect

    page.goto(quantized_demo.url)
    tile(page, "Copper Bloom").wait_for(timeout=WAIT_MS)
    tile(page, "Copper Bloom").click()
    page.locator("#lora-details", has_text="Copper Bloom").wait_for(timeout=WAIT_MS)
    assert page.locator("#prompt textarea").input_value() == "copper bloom"
    page.locator("#prompt textarea").fill("copper bloom, a fox in a forest")
    page.locator("#steps input[type=number]").fill("4")
    page.locator("#steps input[type=number]").press("Enter")
    page.locator("#generate").click()
    info = page.locator("#result-info", has_text="local:copper_bloom.safetensors")
    info.wait_for(timeout=WAIT_MS)
    page.locator("#result-info table.timing").wait_for(timeout=WAIT_MS)
    assert "4 steps" in info.inner_text()
    image = page.locator("#result img").get_attribute("src")
    assert image is not None
    answer = page.request.get(image)
    assert answer.ok, answer.status
    with Image.open(io.BytesIO(answer.body())) as shown:
        assert shown.width > 0 and shown.height > 0

    page.locator("#status-panel").get_by_text("Engine status").click()
    page.locator("#status-panel").get_by_role("button", name="Refresh").click()
    status = page.locator("#engine-status")
    expect(status).to_contain_text("weights fp8, LoRAs as branches (QUANTIZE)", timeout=WAIT_MS)
    page.screenshot(path=str(SHOTS / "quantized-demo.png"), full_page=True)

    (pool,) = api_client(quantized_demo.url, verbose=False).predict(api_name="/pool_status")["pools"]
    assert (pool["model_id"], pool["storage"]) == ("tiny-flux", "fp8")
