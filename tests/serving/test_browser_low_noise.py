"""Each LoRA's "Low-noise scale" in a browser, on the tiny two-stage pool (`MODELS=tiny-wan22`): it follows its
LoRA's scale until the user moves it, then stays; a share link's low-noise scale off its LoRA's scale stays too.
Without a browser: test_video_low_noise.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.app_server import AppServer, served_runtime
from tests.support.browser import WAIT_MS, browser, page

__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    with served_runtime({"MODELS": "tiny-wan22"}, tmp_path_factory.mktemp("tiny-wan22")) as (_, served):
        yield served


def _set(page, slider: str, value: str) -> None:
    box = page.locator(f"{slider} input[type=number]")
    box.fill(value)
    box.press("Enter")


def _number(page, slider: str):
    return page.locator(f"{slider} input[type=number]")


def _second_follows(page) -> None:
    """The second LoRA's scale set to 0.4 and its low-noise scale seen to follow (an event after the ones before)."""
    from playwright.sync_api import expect

    if not page.locator("#lora-2-scale").is_visible():
        page.get_by_text("Blend a second LoRA").click()
    _set(page, "#lora-2-scale", "0.4")
    expect(_number(page, "#lora-2-scale-2")).to_have_value("0.4", timeout=WAIT_MS)


def test_the_low_noise_scale_follows_its_loras_scale_until_moved(page, server):
    from playwright.sync_api import expect

    page.goto(server.url)
    page.locator("#lora-1-scale-2").wait_for(timeout=WAIT_MS)
    _set(page, "#lora-1-scale", "0.5")
    expect(_number(page, "#lora-1-scale-2")).to_have_value("0.5", timeout=WAIT_MS)
    # Moved by the user, it stays when the LoRA's scale moves again.
    _set(page, "#lora-1-scale-2", "0.3")
    _set(page, "#lora-1-scale", "0.7")
    # The second LoRA's follows (its scale's change is handled after the first's): then the first's is settled.
    _second_follows(page)
    expect(_number(page, "#lora-1-scale-2")).to_have_value("0.3")
    expect(_number(page, "#lora-1-scale")).to_have_value("0.7")


def test_a_share_links_own_low_noise_scale_stays(page, server):
    from playwright.sync_api import expect

    page.goto(f"{server.url.rstrip('/')}/?lora=owner%2Fwan-style&lora_scale=0.8&lora_scale_2=1")
    expect(_number(page, "#lora-1-scale")).to_have_value("0.8", timeout=WAIT_MS)
    expect(_number(page, "#lora-1-scale-2")).to_have_value("1", timeout=WAIT_MS)
    _set(page, "#lora-1-scale", "0.6")
    _second_follows(page)
    expect(_number(page, "#lora-1-scale-2")).to_have_value("1")
