"""What the browser tests share: Debian's chromium driven by playwright, a page per test, the gallery's tiles, and
a backend slowed per step so a browser can watch previews and progress.

A test module imports the `browser` and `page` fixtures from here (pytest finds fixtures in its globals).
Screenshots are kept under artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "SHOTS", "WAIT_MS", "SlowSteps", "browser", "page", "tile"]

CHROMIUM = shutil.which("chromium")
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 120_000


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    opened = context.new_page()
    yield opened
    context.close()


def tile(page, title: str):
    return page.locator(f'#lora-gallery button.thumbnail-item:has(img[alt="{title}"])')


class SlowSteps:
    """The app's backend with every denoising step slowed, so a browser can watch the previews arrive."""

    def __new__(cls, engine: object, delay_s: float = 0.6) -> object:
        from serving.backends.local import LocalBackend

        class Slow(LocalBackend):
            async def generate(self, request, *, progress=None, **kwargs):
                def slowed(step: int, total: int) -> None:
                    time.sleep(delay_s)
                    if progress is not None:
                        progress(step, total)

                return await super().generate(request, progress=slowed, **kwargs)

        return Slow.of(engine)  # type: ignore[arg-type]
