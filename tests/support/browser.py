"""What the browser tests share: Debian's chromium driven by playwright, a page per test, the gallery's tiles, and
a backend slowed per step so a browser can watch previews and progress.

A test module imports the `browser` and `page` fixtures from here (pytest finds fixtures in its globals).
Screenshots are kept under artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import io
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.support import waits

__all__ = [
    "CHROMIUM",
    "SHOTS",
    "WAIT_MS",
    "SlowSteps",
    "browser",
    "editor_row_white",
    "editor_upload",
    "page",
    "tile",
    "wait_shown",
    "wait_until",
    "watch_texts",
]

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


def wait_until(check: Callable[[], bool], what: str, timeout_ms: int = WAIT_MS) -> None:
    """Poll `check` (a state read off the page that no locator can wait on, such as a canvas's pixels) until it
    holds; fail naming `what`. Generous, as every wait here: a loaded CI machine renders slowly."""
    waits.wait_until(check, what, timeout_ms / 1000, poll=0.1)


# Every text the elements under `selectors` take, in order, as the page sets them: a state Gradio shows only for a
# moment (the progress bar's "4/6 steps", hidden again by the next streamed preview) is seen even when a busy
# browser takes it and the next one in one go and never paints it.
_WATCH_TEXTS = """(selectors) => {
    window.__texts = window.__texts || {};
    for (const selector of selectors) {
        const element = document.querySelector(selector);
        const seen = window.__texts[selector] = [];
        const record = () => {
            const text = element.innerText;
            if (seen[seen.length - 1] !== text) seen.push(text);
        };
        new MutationObserver(record).observe(element, {subtree: true, childList: true, characterData: true,
                                                       attributes: true});
        record();
    }
}"""


def watch_texts(page, *selectors: str) -> None:
    """Start recording every text the elements under `selectors` show (see `wait_shown`)."""
    page.evaluate(_WATCH_TEXTS, list(selectors))


def wait_shown(page, selector: str, pattern: str, timeout_ms: int = WAIT_MS) -> None:
    """Wait until the element under `selector` (watched by `watch_texts`) has shown a text matching `pattern` (a
    JavaScript regular expression), now or since the watch began."""
    page.wait_for_function(
        "([selector, pattern]) => window.__texts[selector].some(text => new RegExp(pattern).test(text))",
        arg=[selector, pattern],
        timeout=timeout_ms,
    )


def editor_upload(page, path: str, elem_id: str = "input-image") -> None:
    """A file into the image editor, waited for at both ends: the editor is ready for it before (its toolbar
    offers Upload: a file set earlier, while its canvas starts, is dropped and the canvas stays empty), and has
    taken it after (it arms its brush for the image: the brush's size button shows). Generate before that sends no
    image, a stroke before that is lost."""
    editor = page.locator(f"#{elem_id}")
    editor.get_by_role("button", name="Upload", exact=True).wait_for(timeout=WAIT_MS)
    editor.locator("input[type=file]").set_input_files(path)
    editor.get_by_role("button", name="Brush Size", exact=True).wait_for(timeout=WAIT_MS)


def editor_row_white(page, elem_id: str = "input-image") -> bool:
    """Whether the image editor's canvas, as the user sees it (a screenshot: its WebGL pixels cannot be read from
    the page), is white along the middle of its centre row: where a test's mask stroke goes (white, the mask's
    colour), and where no test image of ours is white."""
    from PIL import Image

    canvas = page.locator(f"#{elem_id} .pixi-target canvas").first
    shot = Image.open(io.BytesIO(canvas.screenshot())).convert("RGB")
    width, height = shot.size
    row = [shot.getpixel((x, height // 2)) for x in range(int(width * 0.35), int(width * 0.65))]
    return all(min(pixel) >= 240 for pixel in row)


class SlowSteps:
    """The app's backend with every denoising step slowed, so a browser can watch the previews arrive; with `hold`,
    a run stops after reporting step `hold_at` until the test sets `hold` (and after each step of `holds` until
    its event is set), so that what the page shows mid-run stays until the test has seen it (a busy browser can
    take a whole short run's updates in one go, and never show its progress)."""

    def __new__(
        cls,
        engine: object,
        delay_s: float = 0.6,
        hold: threading.Event | None = None,
        hold_at: int = 0,
        holds: Mapping[int, threading.Event] | None = None,
    ) -> object:
        waits = {**(holds or {}), **({hold_at: hold} if hold is not None else {})}
        from serving.backends.local import LocalBackend

        class Slow(LocalBackend):
            async def generate(self, request, *, progress=None, **kwargs):
                def slowed(step: int, total: int) -> None:
                    time.sleep(delay_s)
                    if progress is not None:
                        progress(step, total)
                    if step in waits:
                        waits[step].wait(WAIT_MS / 1000)

                return await super().generate(request, progress=slowed, **kwargs)

        return Slow.of(engine)  # type: ignore[arg-type]
