"""The UI in a real browser: Debian's chromium driven by playwright, against the launched app.

Screenshots are kept under artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import re
import threading

import pytest

from tests.support.app_server import serve_app, serve_fixture_app
from tests.support.browser import CHROMIUM, SHOTS, WAIT_MS, SlowSteps, browser, page, tile, wait_shown, watch_texts

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures, found by pytest in this module's globals

if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install -y chromium)", allow_module_level=True)


def generate_and_wait(page) -> None:
    page.locator("#generate").click()
    page.locator("#result img").wait_for(timeout=WAIT_MS)
    page.locator("#result-info table.timing").wait_for(timeout=WAIT_MS)


def test_pick_a_hub_lora_fill_its_trigger_and_generate(page, server, fixtures):
    page.goto(server.url)
    tile(page, "peft").wait_for(timeout=WAIT_MS)
    assert page.locator("#lora-gallery button.thumbnail-item").count() >= 10
    page.screenshot(path=str(SHOTS / "hub-gallery.png"), full_page=True)

    tile(page, "peft").click()
    page.locator("#lora-details h3", has_text="peft").wait_for(timeout=WAIT_MS)
    assert page.locator("#prompt textarea").input_value() == "sks style"
    assert page.locator("#lora-1 textarea, #lora-1 input").first.input_value() == fixtures["peft"]
    page.locator("#prompt textarea").fill("sks style, a fox in a forest")

    tile(page, "kohya").click()
    page.locator("#lora-details .badge.nc").wait_for(timeout=WAIT_MS)
    assert page.locator("#prompt textarea").input_value() == "ohwx, a fox in a forest"
    link = page.locator("#lora-details a").get_attribute("href")
    assert link is not None
    assert link.endswith(f"/{fixtures['kohya']}")

    generate_and_wait(page)
    info = page.locator("#result-info").inner_text()
    assert "inference" in info
    assert "total" in info
    assert fixtures["kohya"] in info
    page.locator("#status-panel").get_by_text("Engine status").click()
    page.locator("#api-panel").get_by_text("Use via API: Python and curl").click()
    page.locator("#api-snippets code", has_text="gradio_client").first.wait_for(timeout=WAIT_MS)
    assert server.url in page.locator("#api-snippets").inner_text()
    page.screenshot(path=str(SHOTS / "hub-generated.png"), full_page=True)


def test_a_custom_lora_is_checked_before_generating(page, server, fixtures):
    page.goto(server.url)
    tile(page, "kohya").wait_for(timeout=WAIT_MS)
    page.locator("#prompt textarea").fill("a fox in a forest")
    lora = page.locator("#lora-1 textarea, #lora-1 input").first
    page.locator("#lora-1-options").get_by_text("Revision, weight file, check").click()
    check = page.get_by_role("button", name="Check this LoRA")

    lora.fill(fixtures["sd15"])
    check.click()
    refused = page.locator("#lora-details .lora-error")
    refused.wait_for(timeout=WAIT_MS)
    assert "stable-diffusion-v1-5" in refused.inner_text()

    lora.fill(fixtures["second"])
    check.click()
    page.locator("#lora-details", has_text="✓ loads").wait_for(timeout=WAIT_MS)
    assert "rank 4" in page.locator("#lora-details").inner_text()
    assert page.locator("#prompt textarea").input_value() == "tok, a fox in a forest"
    page.screenshot(path=str(SHOTS / "hub-custom-check.png"), full_page=True)


def test_the_offline_demo_shows_its_banner_and_generates(page, demo_load, tmp_path):
    from engine.settings import Settings
    from serving.runtime import build_runtime

    runtime = build_runtime(Settings.from_env({}), demo_dir=tmp_path, cuda=lambda: False, load=demo_load)
    try:
        assert runtime.wait_ready(timeout=300)
        engine = runtime.backend.served.default.engine  # type: ignore[attr-defined]
        with serve_app(
            engine, runtime.catalog, banner=runtime.banner, backend=runtime.backend, allowed_paths=[tmp_path]
        ) as served:
            page.goto(served.url)
            banner = page.locator("#banner")
            banner.wait_for(timeout=WAIT_MS)
            assert "tiny random-weight model" in banner.inner_text()
            box = banner.bounding_box()
            assert box is not None
            assert box["y"] < 100
            tile(page, "Neon Static").wait_for(timeout=WAIT_MS)
            assert page.locator("#lora-gallery button.thumbnail-item").count() == 6
            tile(page, "Neon Static").click()
            page.locator("#lora-details .badge.nc").wait_for(timeout=WAIT_MS)
            assert page.locator("#prompt textarea").input_value() == "neon static"
            generate_and_wait(page)
            assert "local:neon_static.safetensors" in page.locator("#result-info").inner_text()
            page.screenshot(path=str(SHOTS / "offline-demo.png"), full_page=True)

            # The demo's second pool: SD 1.5 LoRAs are listed under their base and generate on it.
            page.locator("#base-filter input").click()
            page.get_by_role("option", name="Stable Diffusion 1.5 (served)").click()
            page.locator("#base-note", has_text="generate on Stable Diffusion 1.5").wait_for(timeout=WAIT_MS)
            tile(page, "Dusty Rose").wait_for(timeout=WAIT_MS)
            assert page.locator("#lora-gallery button.thumbnail-item").count() == 3
            tile(page, "Dusty Rose").click()
            page.locator("#lora-details", has_text="Dusty Rose").wait_for(timeout=WAIT_MS)
            assert page.locator("#prompt textarea").input_value() == "dusty rose"
            page.locator("#generate").click()
            info = page.locator("#result-info", has_text="local:dusty_rose.safetensors")
            info.wait_for(timeout=WAIT_MS)
            assert "guidance 7.5" in info.inner_text(), "SD 1.5's own defaults (SDXL's guidance is 5)"
            page.screenshot(path=str(SHOTS / "offline-demo-sd15.png"), full_page=True)

            # A run of 12 steps shows the per-step progress the engine reports (recorded as the page shows it, so
            # no longer 60 steps, 23 s at load 4, to keep it on screen).
            page.locator("#steps input[type=number]").fill("12")
            page.locator("#steps input[type=number]").press("Enter")
            watch_texts(page, "#result")
            page.locator("#generate").click()
            wait_shown(page, "#result", "Denoising")
            page.screenshot(path=str(SHOTS / "offline-demo-progress.png"), full_page=False)
            page.locator("#result-info", has_text="12 steps").wait_for(timeout=WAIT_MS)

            # The demo's third pool: FLUX.1 [dev], its LoRAs in four namings; its distilled guidance and the
            # negative prompt it does not read say so, and a kohya LoRA with fused layers generates on it.
            page.locator("#base-filter input").click()
            page.get_by_role("option", name="FLUX.1 [dev] (served)").click()
            note = page.locator("#base-note", has_text="generate on FLUX.1 [dev]")
            note.wait_for(timeout=WAIT_MS)
            assert "distilled guidance 3.5 (no negative prompt)" in note.inner_text()
            tile(page, "Copper Bloom").wait_for(timeout=WAIT_MS)
            assert page.locator("#lora-gallery button.thumbnail-item").count() == 4
            page.get_by_text("Guidance (distilled)").wait_for(timeout=WAIT_MS)
            assert page.get_by_label("Negative prompt").is_disabled()
            tile(page, "Copper Bloom").click()
            page.locator("#lora-details", has_text="Copper Bloom").wait_for(timeout=WAIT_MS)
            assert page.locator("#prompt textarea").input_value() == "copper bloom"
            page.locator("#steps input[type=number]").fill("4")
            page.locator("#steps input[type=number]").press("Enter")
            page.locator("#generate").click()
            info = page.locator("#result-info", has_text="local:copper_bloom.safetensors")
            info.wait_for(timeout=WAIT_MS)
            assert "guidance 3.5" in info.inner_text(), "FLUX.1 [dev]'s own default"
            page.screenshot(path=str(SHOTS / "offline-demo-flux.png"), full_page=True)
    finally:
        runtime.close()


# Every src the result image takes, in order (Gradio swaps the <img> or its src per streamed value).
WATCH_SRCS = """() => {
    window.__srcs = [];
    const root = document.querySelector('#result');
    const record = () => {
        const img = root.querySelector('img');
        if (img && img.src && window.__srcs[window.__srcs.length - 1] !== img.src) window.__srcs.push(img.src);
    };
    new MutationObserver(record).observe(root, {subtree: true, childList: true, attributes: true,
                                               attributeFilter: ['src']});
}"""


def test_the_preview_shows_the_image_forming_before_the_final_one(page, loaded, base_settings, hub, fixtures):
    # The run holds after steps 4 and 8 until the page has shown one preview, then a second: a busy browser can take
    # several previews in one update and paint only the last (CI at load ~6 saw one preview, then the image).
    first, second = threading.Event(), threading.Event()

    def backend(engine):
        return SlowSteps(engine, holds={4: first, 8: second})

    with serve_fixture_app(loaded, base_settings, hub, fixtures, backend=backend) as served:
        page.goto(served.url)
        tile(page, "peft").wait_for(timeout=WAIT_MS)
        tile(page, "peft").click()
        page.locator("#lora-details h3", has_text="peft").wait_for(timeout=WAIT_MS)
        page.locator("#prompt textarea").fill("sks style, a fox in a forest")
        page.locator("#steps input[type=number]").fill("12")
        page.locator("#steps input[type=number]").press("Enter")
        page.evaluate(WATCH_SRCS)
        watch_texts(page, "#result-info")
        page.locator("#generate").click()
        wait_shown(page, "#result-info", "Preview after step")
        page.wait_for_function("window.__srcs.length >= 1", timeout=WAIT_MS)
        first.set()
        page.wait_for_function("new Set(window.__srcs).size >= 2", timeout=WAIT_MS)
        second.set()
        page.locator("#request-column").screenshot(path=str(SHOTS / "preview.png"))
        page.locator("#result-info table.timing").wait_for(timeout=WAIT_MS)
        final = page.locator("#result img").get_attribute("src")
        srcs = page.evaluate("window.__srcs")
    assert final is not None
    assert srcs[-1] == final
    intermediate = [src for src in srcs[:-1] if src != final]
    # PREVIEW_EVERY=2 of 12 steps: previews after steps 2..10; the browser saw at least two of them, then the image.
    assert len(set(intermediate)) >= 2, srcs
    assert "12 steps" in page.locator("#result-info").inner_text()


def test_the_comparison_grid_shows_labelled_cells_and_downloads(page, server, fixtures, tmp_path):
    from playwright.sync_api import expect

    page.goto(server.url)
    tile(page, "peft").wait_for(timeout=WAIT_MS)
    page.locator("#prompt textarea").fill("a fox in a forest")
    page.get_by_label("Compare").check()
    listed = page.locator("#compare-loras textarea")
    page.get_by_role("tab", name="Compare").click()
    listed.wait_for(timeout=WAIT_MS)
    # Each click appends to the list the page holds, so the next click waits for the last one's answer.
    tile(page, "peft").click()
    expect(listed).to_have_value(fixtures["peft"], timeout=WAIT_MS)
    tile(page, "kohya").click()
    expect(listed).to_have_value(f"{fixtures['peft']}\n{fixtures['kohya']}", timeout=WAIT_MS)
    assert listed.input_value().splitlines() == [fixtures["peft"], fixtures["kohya"]]
    page.locator("#compare-scales textarea, #compare-scales input").first.fill("1, 0.5")
    # The second LoRA active on the first half of the steps only (issue 51's window fields, one value per LoRA).
    page.locator("#compare-starts textarea, #compare-starts input").first.fill("0")
    page.locator("#compare-ends textarea, #compare-ends input").first.fill("1, 0.5")
    page.locator("#compare").click()
    cells = page.locator("#compare-cells button.thumbnail-item")
    page.locator("#compare-info table.timing").wait_for(timeout=WAIT_MS)
    assert cells.count() == 3
    captions = page.locator("#compare-cells .caption-label").all_inner_texts()
    assert captions == ["base", "peft (1)", "kohya (0.5 from 0 to 0.5)"]
    info = page.locator("#compare-info").inner_text()
    assert all(label in info for label in captions)
    # docs/screenshot-compare.png is this screenshot, copied (the README's and docs/usage.md's).
    page.locator("#compare-tab").screenshot(path=str(SHOTS / "compare.png"))

    with page.expect_download(timeout=WAIT_MS) as download:
        page.locator("#compare-grid").get_by_role("button", name="Download").click()
    saved = tmp_path / "grid.png"
    download.value.save_as(saved)
    from PIL import Image

    with Image.open(saved) as grid:
        assert grid.format == "PNG"
        assert grid.width > 3 * 256


def choose(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def test_the_sampler_menu_the_speed_switch_history_and_a_share_link(page, browser, server, fixtures):
    from playwright.sync_api import expect

    page.goto(server.url)
    tile(page, "lcm-lora").wait_for(timeout=WAIT_MS)
    tile(page, "lcm-lora").click()
    # A speed LoRA: its own sampler, steps and guidance fill the form, and the note says why.
    note = page.locator("#settings-note")
    expect(note).to_contain_text("LCM speed LoRA", timeout=WAIT_MS)
    expect(page.locator("#sampler input")).to_have_value("LCM", timeout=WAIT_MS)
    expect(page.locator("#guidance input[type=number]")).to_have_value("1", timeout=WAIT_MS)
    page.screenshot(path=str(SHOTS / "speed-lora.png"), full_page=True)
    # The switch: off gives the model's own defaults back.
    page.locator("#use-recommended input").uncheck()
    expect(page.locator("#guidance input[type=number]")).to_have_value("5", timeout=WAIT_MS)
    expect(note).to_contain_text("recommended settings are off", timeout=WAIT_MS)
    page.locator("#use-recommended input").check()
    expect(page.locator("#sampler input")).to_have_value("LCM", timeout=WAIT_MS)

    # The user overrides the sampler from the menu, asks for two images and generates.
    choose(page, "sampler", "Euler a")
    page.locator("#num-images input[type=number]").fill("2")
    page.locator("#num-images input[type=number]").press("Enter")
    page.locator("#prompt textarea").fill("a fox in a forest")
    page.locator("#randomize input").uncheck()
    page.locator("#generate").click()
    info = page.locator("#result-info", has_text="Euler a")
    info.wait_for(timeout=WAIT_MS)
    assert "4 steps" in info.inner_text() and "guidance 1" in info.inner_text()
    expect(page.locator("#result-gallery button.thumbnail-item")).to_have_count(2, timeout=WAIT_MS)
    share = page.locator("#share-link textarea, #share-link input").first
    expect(share).to_have_value(re.compile(r"sampler=Euler\+a"), timeout=WAIT_MS)
    link = share.input_value()
    assert f"lora={fixtures['lcm-lora'].replace('/', '%2F')}" in link and "images=2" in link
    seed = re.search(r"seed=(\d+)", link).group(1)  # type: ignore[union-attr]
    first_image = page.locator("#result img").get_attribute("src")
    page.screenshot(path=str(SHOTS / "share-link.png"), full_page=True)

    # The history keeps it; "use these settings again" puts them back after the form changed.
    choose(page, "sampler", "DDIM")
    page.locator("#history-panel").get_by_text("History (this browser session)").click()
    page.locator("#history button.thumbnail-item").first.click()
    page.locator("#use-again").click()
    expect(page.locator("#sampler input")).to_have_value("Euler a", timeout=WAIT_MS)

    # The link reopens the Space with the same LoRA and settings, and makes the same image.
    shared = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
    try:
        shared.goto(link)
        expect(shared.locator("#lora-1 textarea, #lora-1 input").first).to_have_value(
            fixtures["lcm-lora"], timeout=WAIT_MS
        )
        expect(shared.locator("#sampler input")).to_have_value("Euler a", timeout=WAIT_MS)
        expect(shared.locator("#seed input")).to_have_value(seed, timeout=WAIT_MS)
        assert shared.locator("#prompt textarea").input_value() == "a fox in a forest"
        shared.locator("#generate").click()
        shared.locator("#result-info", has_text=seed).wait_for(timeout=WAIT_MS)
        again = shared.locator("#result img").get_attribute("src")
        assert first_image is not None and again is not None
        assert page.request.get(first_image).body() == shared.request.get(again).body()
    finally:
        shared.context.close()


def test_a_page_with_one_lora_draws_its_tile_at_the_size_of_a_full_pages(page, server):
    """A search that finds one LoRA drew its tile across the whole column (Gradio fits the columns to the items)."""
    from playwright.sync_api import expect

    page.goto(server.url)
    tile(page, "peft").wait_for(timeout=WAIT_MS)
    tiles = page.locator("#lora-gallery button.thumbnail-item")
    assert tiles.count() >= 4
    full = tiles.first.bounding_box()
    search = page.locator("#lora-search textarea, #lora-search input").first
    search.fill("dora")
    search.press("Enter")
    expect(tiles).to_have_count(1, timeout=WAIT_MS)
    expect(tile(page, "dora")).to_be_visible(timeout=WAIT_MS)
    one = tiles.first.bounding_box()
    page.screenshot(path=str(SHOTS / "one-lora-page.png"), full_page=True)
    assert full is not None and one is not None
    assert abs(one["width"] - full["width"]) <= 2 and abs(one["height"] - full["height"]) <= 2, (full, one)


def test_the_sampler_menus_default_label_is_shown_whole(page, server):
    """At the default width the default's label ran under the menu's arrow, cut off."""
    page.goto(server.url)
    sampler = page.locator("#sampler input")
    sampler.wait_for(timeout=WAIT_MS)
    page.locator("#sampler").screenshot(path=str(SHOTS / "sampler-default.png"))
    measure = "e => ({value: e.value, scroll: e.scrollWidth, client: e.clientWidth})"
    shown = sampler.evaluate(measure)
    assert shown["value"] == "Default (Euler)", shown
    assert shown["scroll"] <= shown["client"], shown
    # The longest name the menu offers fits too.
    choose(page, "sampler", "DPM++ SDE Karras")
    longest = sampler.evaluate(measure)
    assert longest["value"] == "DPM++ SDE Karras" and longest["scroll"] <= longest["client"], longest
