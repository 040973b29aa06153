"""The UI's video pieces without a browser: a video pool's base shows Frames and FPS (with the clip's length) and
a video result in the image's place, an image pool the other way round; the form's frames and rate reach only a
video pool's request; the progress line says the time left at the steps' pace; a video result's line and info
read text- or image-to-video (from the result), and its history entry and share link keep its frames and rate; an
in-context pool (LTX-2's IC-LoRAs) shows the reference video's slot, whose upload its request carries as
`/generate_video`'s `video` does (an upload left in the hidden slot reaches no other pool), with the reference
strength and downscale shown and hidden with it, which reach the request as `/generate_video`'s arguments of those
names do, only with a video, and a bad one of which gets the one check's message."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
import pytest

from engine.errors import InvalidRequestError
from engine.outcomes import ServedPool
from engine.pipeline.stepshare import Ahead
from engine.requests import GenerateRequest, InputImage, ModelDefaults
from engine.video_references import checked_reference_settings
from serving.ui import history, session
from serving.ui.api_requests import read_video
from serving.ui.formatting import result_info
from serving.ui.inputs import mode_html
from serving.ui.progress import StepProgress
from serving.ui.video_api import _generate_video_api
from serving.ui.video_api import _request as generate_video_request
from serving.ui.video_ui import length_text, on_base, video_controls, video_request
from tests.support.reference_video import reference_mp4
from tests.support.video import frames, video_result

VIDEO = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128, video=True, num_frames=9, fps=8, max_frames=17)
IMAGE = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)
IN_CONTEXT = dataclasses.replace(VIDEO, reference_video=True)
POOLS = (
    ServedPool("owner/image-base", "owner/image-base", "sdxl", IMAGE, True),
    ServedPool("owner/video-base", "owner/video-base", "video", VIDEO, False),
    ServedPool("owner/ltx-base", "owner/ltx-base", "ltx2", IN_CONTEXT, False),
)
LIMITS = SimpleNamespace(max_input_pixels=4096, max_video_frames=17)
HANDLERS = SimpleNamespace(pools=POOLS, default=POOLS[0], settings=LIMITS)


def test_the_length_is_frames_over_fps():
    assert length_text(81, 16) == "81 frames: 5.1 s at 16 fps"
    assert length_text(None, 16) == ""


def test_a_video_base_shows_its_frames_fps_and_a_video_result():
    row, frames, fps, length, video, image, clip = on_base(HANDLERS, "owner/video-base")  # type: ignore[arg-type]
    assert row.visible is True and video.visible is True and image.visible is False
    assert clip.visible is False, "Wan's pipelines take no reference video"
    assert (frames.minimum, frames.maximum, frames.step, frames.value) == (5, 17, 4, 9)
    assert fps.value == 8
    assert length.value == "9 frames: 1.1 s at 8 fps"


def test_an_image_base_hides_them_again():
    row, _, _, length, video, image, clip = on_base(HANDLERS, "owner/image-base")  # type: ignore[arg-type]
    assert row.visible is False and video.visible is False and image.visible is True and clip.visible is False
    assert length.value == ""


def test_the_forms_frames_and_fps_reach_only_a_video_pools_request():
    request = GenerateRequest(prompt="a fox")
    on_video = video_request(HANDLERS, request, "owner/video-base", 13, 12)  # type: ignore[arg-type]
    assert (on_video.num_frames, on_video.fps) == (13, 12)
    assert video_request(HANDLERS, request, "owner/image-base", 13, 12) is request  # type: ignore[arg-type]


def test_an_in_context_base_shows_the_reference_videos_slot():
    row, *_, video, _, clip = on_base(HANDLERS, "owner/ltx-base")  # type: ignore[arg-type]
    assert row.visible is True and video.visible is True and clip.visible is True


def _inside(component: Any, block: Any) -> bool:
    parent = component.parent
    while parent is not None and parent is not block:
        parent = parent.parent
    return parent is block


@pytest.mark.parametrize(("defaults", "shown"), [(IN_CONTEXT, True), (VIDEO, False), (IMAGE, False)])
def test_the_reference_settings_are_shown_and_hidden_with_the_reference_video(defaults, shown):
    with gr.Blocks():
        controls = video_controls(defaults)
    # One block shown or hidden (`on_base`'s last output): the video and both settings inside it.
    assert controls.in_context.visible is shown
    assert all(_inside(c, controls.in_context) for c in (controls.reference, *controls.settings))
    strength, downscale = controls.settings
    assert (strength.label, downscale.label) == ("Reference strength", "Reference downscale")
    # Their ranges are the declaration's words (`engine.requests`), and empty is diffusers' default.
    assert "a number from 0 to 1" in (strength.info or "") and "an integer from 1 to 8" in (downscale.info or "")
    assert strength.value is None and downscale.value is None
    # Gradio hands a value over as typed (no bound or rounding of its own): the one check judges it.
    assert (strength.preprocess(1.5), downscale.preprocess(2.5)) == (1.5, 2.5)


def _generate_video_arguments(**given: Any) -> dict[str, Any]:
    """`/generate_video`'s arguments: its signature's defaults, with `given`."""
    parameters = inspect.signature(_generate_video_api(HANDLERS)).parameters  # type: ignore[arg-type]
    defaults = {name: p.default for name, p in parameters.items() if name != "progress"}
    return defaults | given


def test_the_reference_settings_reach_the_request_as_generate_video_s_arguments_do(tmp_path):
    clip = tmp_path / "reference.mp4"
    clip.write_bytes(reference_mp4(frames=9, side=64))
    request = GenerateRequest(prompt="a fox")
    for strength, downscale in ((0.25, 2), (None, 2), (0.5, None), (None, None)):
        sent = video_request(HANDLERS, request, "owner/ltx-base", 9, 24, (), str(clip), (strength, downscale))  # type: ignore[arg-type]
        settings = {"reference_strength": strength, "reference_downscale": downscale}
        arguments = _generate_video_arguments(prompt="a fox", video=str(clip), num_frames=9, fps=24, **settings)
        api = generate_video_request(HANDLERS, arguments)  # type: ignore[arg-type]
        assert (sent.reference_strength, sent.reference_downscale) == (strength, downscale)
        assert (sent.reference_strength, sent.reference_downscale) == (api.reference_strength, api.reference_downscale)
        assert sent.reference_video == api.reference_video
    # Without a video the settings are not sent (the text-to-video run the form shows), nor to a pool without one.
    alone = video_request(HANDLERS, request, "owner/ltx-base", 9, 24, (), None, (0.25, 2))  # type: ignore[arg-type]
    elsewhere = video_request(HANDLERS, request, "owner/video-base", 9, 24, (), str(clip), (0.25, 2))  # type: ignore[arg-type]
    for run in (alone, elsewhere):
        assert (run.reference_video, run.reference_strength, run.reference_downscale) == (None, None, None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ((1.5, None), r"reference_strength=1\.5 is out of range; accepted: a number from 0 to 1"),
        ((None, 2.5), r"reference_downscale=2\.5 is not an integer; accepted: an integer"),
        ((None, 3), r"reference_downscale=3 does not divide the video's 64x64 .*accepted: "),
    ],
)
def test_a_bad_reference_setting_gets_the_checks_message(tmp_path, settings, message):
    clip = tmp_path / "reference.mp4"
    clip.write_bytes(reference_mp4(frames=9, side=64))
    sent = video_request(HANDLERS, GenerateRequest(prompt="a fox"), "owner/ltx-base", 9, 24, (), str(clip), settings)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match=message):
        checked_reference_settings(sent, (64, 64), IN_CONTEXT.side_multiple)


def test_the_slots_upload_is_the_requests_reference_video_as_generate_video_reads_it(tmp_path):
    clip = tmp_path / "reference.mp4"
    clip.write_bytes(reference_mp4(frames=9, side=64))
    request = GenerateRequest(prompt="a fox")
    sent = video_request(HANDLERS, request, "owner/ltx-base", 9, 24, (), str(clip))  # type: ignore[arg-type]
    # The same reading as /generate_video's `video` (one reader): its bytes and header, nothing decoded.
    assert sent.reference_video == read_video(str(clip), "video", 4096, 17)
    assert (sent.reference_video.frames, sent.reference_video.width) == (9, 64)  # type: ignore[union-attr]
    # A slot left filled when the base changed is hidden: no other pool's request carries it.
    assert video_request(HANDLERS, request, "owner/video-base", 9, 24, (), str(clip)).reference_video is None  # type: ignore[arg-type]
    assert video_request(HANDLERS, request, "owner/image-base", 9, 24, (), str(clip)) is request  # type: ignore[arg-type]


def test_a_bad_upload_in_the_slot_is_refused_by_name_before_anything_runs(tmp_path):
    clip = tmp_path / "reference.mp4"
    clip.write_bytes(reference_mp4(frames=25, side=32))
    with pytest.raises(InvalidRequestError, match=r"reference video is too long: 25 frames.*accepted: an MP4 video"):
        video_request(HANDLERS, GenerateRequest(prompt="a fox"), "owner/ltx-base", 9, 24, (), str(clip))  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("step", "expected"), [(0, "Denoising"), (2, "Denoising (about 4.00 s left)")])
def test_the_progress_line_says_the_time_left_at_the_steps_pace(step, expected):
    shown: list[tuple[object, str]] = []
    clock = _Clock()
    progress = StepProgress(lambda value, desc, unit: shown.append((value, desc)), clock)  # type: ignore[arg-type]
    progress(0, 4)
    clock.now += 4.0  # two steps in 4 s: 2 s a step, two steps left
    progress(step, 4)
    assert shown[-1] == ((step, 4), expected)


def test_a_run_waiting_for_the_gpu_says_behind_what_and_its_time_left_leaves_the_wait_out():
    # Issue 48: an image paused for a video's step (engine.pipeline.stepshare tells the progress what is ahead).
    shown: list[tuple[object, str]] = []
    clock = _Clock()
    progress = StepProgress(lambda value, desc, unit: shown.append((value, desc)), clock)  # type: ignore[arg-type]
    progress(1, 5)
    clock.now += 2.0
    progress(2, 5)
    progress.waiting(Ahead(images=0, videos=1, seconds=40.0))
    assert shown[-1] == ((2, 5), "waiting for the GPU: 1 video ahead, about 40 s")
    clock.now += 40.0  # the video's step
    progress(3, 5)
    clock.now += 2.0
    progress(4, 5)
    # 2 s a step since the wait, one step left: the 40 s wait is not taken for the pace.
    assert shown[-1] == ((4, 5), "Denoising (about 2.00 s left)")


def test_cancel_cancels_the_running_generation(server):
    """The Cancel button cancels the Generate event (Gradio cancels its task: the stream closes, and the engine
    stops the run at its next step, as tests/serving/test_http_api.py's hang-ups show)."""
    fns = server.demo.fns  # type: ignore[attr-defined]
    generating = {i for i, fn in fns.items() if getattr(fn.fn, "__name__", "") == "generate_ui"}
    assert len(generating) == 1
    cancelling = [fn for fn in fns.values() if getattr(fn, "cancels", None)]
    assert [set(fn.cancels) for fn in cancelling] == [generating]


def test_the_generate_event_hands_the_reference_video_and_its_settings_over_by_name(server):
    """The Generate event takes the slot and both settings by name (`video_request` reads them), as Gradio fills
    its keyword parameters from the named components."""
    fns = server.demo.fns  # type: ignore[attr-defined]
    event = next(fn for fn in fns.values() if getattr(fn.fn, "__name__", "") == "generate_ui")
    keywords = event.input_keyword_names
    named = dict(zip(keywords, event.inputs[len(event.inputs) - len(keywords) :], strict=True))
    ids = {name: named[name].elem_id for name in ("reference_video", "reference_strength", "reference_downscale")}
    assert ids == {name: name.replace("_", "-") for name in ids}


def test_a_share_link_and_use_these_settings_again_fill_the_reference_settings_boxes(server):
    """The link read on load and "use these settings again" write `session.form_values`' in-context settings
    (tests/serving/test_session.py) into the boxes under the reference video's slot."""
    fns = server.demo.fns  # type: ignore[attr-defined]
    restores = [fn for fn in fns.values() if getattr(fn.fn, "__name__", "") in ("opened", "again")]
    assert len(restores) == 2
    for fn in restores:
        written = {session.FIELDS[i]: c.elem_id for i, c in enumerate(fn.outputs[: len(session.FIELDS)])}
        assert (written["reference_strength"], written["reference_downscale"]) == (
            "reference-strength",
            "reference-downscale",
        )


def test_the_per_base_curl_line_of_a_video_pool_asks_for_its_frames_and_saves_an_mp4():
    from serving.ui.pool_views import pools_api_snippets

    text = pools_api_snippets("http://host/", POOLS)
    assert '"num_frames": 9, "fps": 8}}\' > result.mp4' in text
    assert '"height": 64}}\' > result.jpg' in text


def test_a_video_runs_preview_shows_the_hidden_image_an_image_runs_passes_as_it_is():
    from PIL import Image

    from serving.ui.video_ui import preview

    frame = Image.new("RGB", (8, 8))
    shown = preview(frame, GenerateRequest(prompt="x", num_frames=5))
    assert shown.visible is True and shown.value is not None
    assert preview(frame, GenerateRequest(prompt="x")) is frame


def _results() -> dict[str, Any]:
    """A text-to-video and an image-to-video result (frames made in the test), and an image run from an image."""
    start = InputImage.from_pil(frames(1)[0])
    t2v = video_result(GenerateRequest(prompt="a fox", num_frames=5, fps=8))
    i2v = video_result(GenerateRequest(prompt="the fox turns", image=start, num_frames=9, fps=12))
    return {"t2v": t2v, "i2v": i2v, "i2i": dataclasses.replace(i2v, frames=(), fps=0)}


def test_a_video_results_line_and_info_say_text_or_image_to_video_read_from_the_result():
    results = _results()
    assert "Text-to-video: 5 frames at 8 fps" in mode_html(results["t2v"])
    line = mode_html(results["i2v"])
    assert "Image-to-video: 9 frames at 12 fps from the input image" in line and "Image-to-image" not in line
    # The same request without frames is an image made from an image, as before.
    assert "Image-to-image" in mode_html(results["i2i"])
    modes = {name: result_info(result)["mode"] for name, result in results.items()}
    assert modes == {"t2v": "text-to-video", "i2v": "image-to-video", "i2i": "image-to-image"}


FORM = {
    **dict.fromkeys(history.FORM),
    "prompt": "a fox",
    "negative": "",
    "size": "64x48",
    "steps": 2,
    "guidance": 5.0,
    "sampler": "",
    "images": 1,
    "clip_skip": 1,
    "base": "owner/video-base",
    "history": [],
}


@pytest.mark.parametrize("name", ["t2v", "i2v"])
def test_history_and_share_links_of_a_video_keep_its_frames_and_fps(name):
    result = _results()[name]
    link, _, entries = history.remember(FORM, result, "https://space.example/")
    query = dict(parse_qsl(urlsplit(link).query))
    assert (query["num_frames"], query["fps"]) == (str(len(result.frames)), str(result.fps))
    assert entries[0]["params"] == query
    # "Use these settings again" and an opened link put them back in the video pool's form...
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, VIDEO, 60), strict=True))
    assert (filled["num_frames"], filled["fps"]) == (len(result.frames), result.fps)
    # ...and the base filter's switch to that pool keeps them rather than its defaults.
    waiting = {"base": "owner/video-base", "video": [filled["num_frames"], filled["fps"]]}
    _, shown_frames, shown_fps, length, _, _, _ = on_base(HANDLERS, "owner/video-base", waiting)  # type: ignore[arg-type]
    assert (shown_frames.value, shown_fps.value) == (len(result.frames), result.fps)
    assert length.value == length_text(len(result.frames), result.fps)
    # An image pool's form has no frames to fill; frames off the pool's 4k+1 rule are left as the form has them.
    assert session.video_values(query, IMAGE) == (None, None)
    assert session.video_values({"num_frames": "7", "fps": "99"}, VIDEO) == (None, None)
