"""Gradio's files are cleaned (issue 47, item 10): the Space's Blocks delete what Gradio keeps in its temp folder
(GRADIO_TEMP_DIR: each video result's MP4, each upload) once it is TEMP_FILES_MAX_AGE_S old, so a long-running
Space's disk does not fill with them.

The app is the Space's own (`build_demo`, served as `serve` launches it) over a stand-in video pool
(tests/support/video.py), with an 8 s age; `gradio_client` sends an image-to-video request (the image an upload)
and downloads the answer to a folder of its own. The temp folder holds the upload and the MP4 once it is answered,
and loses both once they are old (waited on, not slept). The stand-in pool takes a reference video (as an LTX-2
IC-LoRA pool does): a refused one (a truncated MP4) leaves nothing behind, through gradio_client (its upload alone,
gone once old) or `POST /` (no file at all), in Gradio's folder or the process's temp folder.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gradio_client import handle_file
from PIL import Image

from engine.outcomes import ServedPool
from engine.requests import ModelDefaults
from engine.settings import Settings
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.ui.blocks import build_demo
from serving.ui.launch import serve
from tests.support.app_server import free_port
from tests.support.clients import api_client
from tests.support.reference_video import reference_mp4
from tests.support.video import VideoBackend
from tests.support.waits import wait_until

VIDEO = ModelDefaults(
    steps=4, guidance=5.0, side=64, max_side=128, video=True, num_frames=9, fps=8, max_frames=17, reference_video=True
)
AGE_S = 8
# Gradio looks every 4 s (`Settings.delete_cache`: half the age); generous for a loaded machine. The age is long
# enough that an upload is read before it is deleted, even on a busy machine.
GONE_WITHIN_S = 60


class VideoPool(VideoBackend):
    """The stand-in video backend as one served video pool."""

    def pools(self) -> tuple[ServedPool, ...]:  # type: ignore[override]
        return (ServedPool("owner/video-base", "owner/video-base", "wan", VIDEO, True),)


def files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()]


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """The app with an 8 s TEMP_FILES_MAX_AGE_S and its own GRADIO_TEMP_DIR: (its URL, that folder); the process's
    `tempfile` folder is `tmp_path`'s "temp" meanwhile."""
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    handlers = Handlers(VideoPool(), None, Settings(temp_files_max_age_s=AGE_S))  # type: ignore[arg-type]
    demo = build_demo(handlers)
    url = serve(demo, http_routes(handlers), server_name="127.0.0.1", server_port=free_port(), block=False, quiet=True)
    try:
        yield url, folder
    finally:
        demo.close()


def test_results_and_uploads_leave_the_temp_folder_once_old(temp_dir, tmp_path):
    url, folder = temp_dir
    # What the app keeps for good (the UI's example image: a component's value, which Gradio never deletes).
    kept = set(files(folder))
    image = tmp_path / "start.png"
    Image.new("RGB", (64, 48), (200, 90, 30)).save(image)
    client = api_client(url, verbose=False, download_files=str(tmp_path / "client"))
    video, info = client.predict(
        prompt="a fox", image=handle_file(str(image)), num_frames=9, api_name="/generate_video"
    )  # fmt: skip
    assert info["num_frames"] == 9 and Path(video["video"] if isinstance(video, dict) else video).is_file()
    made = sorted(path.name for path in set(files(folder)) - kept)
    assert made == ["start.png", "video.mp4"], made  # the upload and the result, once each (no empty strays)
    wait_until(lambda: not set(files(folder)) - kept, "Gradio's files deleted once old", GONE_WITHIN_S, poll=0.2)
    client.close()


def test_a_refused_reference_video_leaves_nothing_behind(temp_dir, tmp_path):
    """A truncated MP4 is refused at the door, through gradio_client and over HTTP: Gradio's folder holds the
    upload alone (no result, no stray empty file), which goes once old; `POST /`'s base64 leaves no file anywhere;
    the process's temp folder stays empty throughout."""
    url, folder = temp_dir
    kept, scratch = set(files(folder)), tmp_path / "temp"
    clip = reference_mp4(frames=9, side=64)
    upload = tmp_path / "reference.mp4"
    upload.write_bytes(clip[: len(clip) // 2])
    client = api_client(url, verbose=False, download_files=str(tmp_path / "client"))
    with pytest.raises(Exception, match="video is a truncated MP4"):
        client.predict(prompt="a fox", video=handle_file(str(upload)), api_name="/generate_video")
    made = sorted(path.name for path in set(files(folder)) - kept)
    assert made == ["reference.mp4"], made  # the upload only: nothing was decoded, run or written for it
    data = base64.b64encode(clip[: len(clip) // 2]).decode("ascii")
    answer = httpx.post(url, json={"inputs": "a fox", "parameters": {"video": data}}, timeout=60)
    assert answer.status_code == 400 and "is a truncated MP4" in answer.json()["error"], answer.text[:300]
    assert sorted(path.name for path in set(files(folder)) - kept) == made, "POST / wrote no file"
    assert files(scratch) == [], files(scratch)
    wait_until(lambda: not set(files(folder)) - kept, "the refused upload deleted once old", GONE_WITHIN_S, poll=0.2)
    assert files(scratch) == [] and not list((tmp_path / "client").rglob("*.mp4"))
    client.close()
