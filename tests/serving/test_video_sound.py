"""The tiny LTX-2 pool through the doors (`MODELS=tiny-ltx2`): its video comes with its sound. `POST /` answers an
MP4 whose AAC track PyAV decodes at the pipeline's rate, starting with the first frame and lasting the frames'
duration (within one AAC frame), its recipe in the file's comment as for Wan, from text or from an image
(image-to-video: huggingface_hub's body, the image as the first frame); gradio_client's `/generate_video`
gives the same bytes (the UI's gr.Video plays that file: `serving.ui.video_ui`); `Accept: audio/wav` gives the sound
alone, the backend's own waveform padded with silence to the clip's length; an animated WebP or GIF says in
`X-Warnings` that it carries no sound."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from huggingface_hub.inference._providers.hf_inference import HFInferenceBinaryInputTask

from engine.requests import GenerateRequest
from serving.handlers import Handlers
from serving.sound import clip_samples
from serving.video import decode_mp4
from tests.support.app_server import AppServer, served_runtime
from tests.support.clients import api_client
from tests.support.video import frames

PROMPT, SEED, STEPS, FRAMES, FPS = "a fox running through snow", 5, 2, 9, 24
BODY = {"inputs": PROMPT, "parameters": {"num_inference_steps": STEPS, "seed": SEED, "num_frames": FRAMES, "fps": FPS}}
# The tiny vocoder's rate, and AAC's frame (1024 samples): the encoder's last frame is padded to it.
RATE, AAC_FRAME = 16_000, 1024


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AppServer, Handlers]]:
    with served_runtime({"MODELS": "tiny-ltx2"}, tmp_path_factory.mktemp("tiny-ltx2")) as (runtime, served):
        yield served, Handlers(runtime.backend, runtime.catalog, runtime.settings)


def _post(server: AppServer, accept: str | None = None) -> httpx.Response:
    headers = {"Accept": accept} if accept else {}
    answer = httpx.post(server.url, json=BODY, headers=headers, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    return answer


@pytest.fixture(scope="module")
def posted(ltx2) -> bytes:
    answer = _post(ltx2[0])
    assert answer.headers["content-type"] == "video/mp4"
    return answer.content


def test_the_mp4_carries_the_sound_from_the_first_frame_for_the_clips_duration(posted):
    with av.open(io.BytesIO(posted)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert audio.codec_context.name == "aac" and audio.rate == RATE and audio.channels == 2
        assert video.start_time == 0 and audio.start_time == 0, "the sound and the video start together"
        assert video.frames == FRAMES
        seconds = float(audio.duration * audio.time_base)
        assert abs(seconds - FRAMES / FPS) <= AAC_FRAME / RATE, seconds
        decoded = sum(frame.samples for frame in container.decode(audio))
    assert round(FRAMES * RATE / FPS) <= decoded < round(FRAMES * RATE / FPS) + AAC_FRAME
    read = decode_mp4(posted)
    assert len(read.frames) == FRAMES and read.fps == Fraction(FPS)
    assert read.comment is not None and f"Seed: {SEED}" in read.comment


def test_an_image_to_video_mp4_carries_the_sound_too(ltx2, posted, tmp_path):
    """`POST /` with an image (the body huggingface_hub's image-to-video helper builds) runs LTX-2's image-to-video
    pipeline on the same pool: another video, with its AAC track from the first frame for the clip's duration."""
    server, _ = ltx2
    start = tmp_path / "start.png"
    frames(1, 64, 64)[0].save(start)
    parameters = {"prompt": PROMPT, "num_frames": FRAMES, "num_inference_steps": STEPS, "seed": SEED, "fps": FPS}
    prepared = HFInferenceBinaryInputTask("image-to-video").prepare_request(
        inputs=start.read_bytes(), parameters=parameters, headers={}, model=server.url, api_key=None
    )
    answer = httpx.post(prepared.url, content=prepared.data, headers=prepared.headers, timeout=600)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"] == "video/mp4" and answer.content != posted
    with av.open(io.BytesIO(answer.content)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert audio.codec_context.name == "aac" and audio.rate == RATE and audio.channels == 2
        assert video.start_time == 0 and audio.start_time == 0 and video.frames == FRAMES
        assert abs(float(audio.duration * audio.time_base) - FRAMES / FPS) <= AAC_FRAME / RATE
        decoded = sum(frame.samples for frame in container.decode(audio))
    assert round(FRAMES * RATE / FPS) <= decoded < round(FRAMES * RATE / FPS) + AAC_FRAME
    recipe = decode_mp4(answer.content).comment
    assert recipe is not None and f"Seed: {SEED}" in recipe


def test_gradio_client_gets_the_same_mp4_with_its_sound(ltx2, posted):
    server, _ = ltx2
    client = api_client(server.url, verbose=False)
    path, info = client.predict(
        prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=FRAMES, fps=FPS, api_name="/generate_video"
    )  # fmt: skip
    assert Path(path["video"] if isinstance(path, dict) else path).read_bytes() == posted
    assert (info["num_frames"], info["fps"]) == (FRAMES, FPS)


def test_accept_audio_wav_gives_the_sound_alone(ltx2):
    server, handlers = ltx2
    answer = _post(server, "audio/wav")
    assert answer.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(answer.content)) as read:
        assert (read.getframerate(), read.getnchannels(), read.getsampwidth()) == (RATE, 2, 2)
        assert read.getnframes() == round(FRAMES * RATE / FPS)
        pcm = np.frombuffer(read.readframes(read.getnframes()), dtype="<i2").reshape(-1, 2).T / 32767.0
    request = GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=FRAMES, fps=FPS)
    made = asyncio.run(handlers.generate(request, transport="ui"))
    assert made.audio is not None and made.audio.rate == RATE
    # The backend's own waveform (shorter than the clip: padded with silence), to 16-bit rounding.
    assert np.abs(pcm - clip_samples(made.audio, FRAMES, FPS)).max() <= 1 / 32767
    assert made.audio.samples.shape[1] < read.getnframes(), "the vocoder's waveform is shorter than the clip"


@pytest.mark.parametrize("media_type", ["image/webp", "image/gif"])
def test_an_animated_answer_says_it_carries_no_sound(ltx2, media_type):
    answer = _post(ltx2[0], media_type)
    assert answer.headers["content-type"] == media_type
    warnings = json.loads(answer.headers["x-warnings"])
    assert any("carries no sound" in w and "audio/wav" in w for w in warnings), warnings
