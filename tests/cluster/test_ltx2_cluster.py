"""The tiny LTX-2 pool's video with sound through the cluster without Ray: the ingress's `POST /` (the Ray handle
path) and a `BACKEND_URL` front end (`RemoteBackend` reading the ingress's `/v1/generate` over HTTP) answer what
a single process's door answers for the same request, byte for byte and warning for warning: `Accept: audio/wav`
the sound alone (not the MP4 with a "no sound" warning), `video/mp4` the MP4 with its AAC track. `image/webp` is
the animated image saying it carries no sound, as one process's does, but made from the MP4's decoded frames
(docs/cluster.md, "Video answers": lossy twice), so it is the WebP of the single process's MP4, not its WebP."""

from __future__ import annotations

import dataclasses
import io
import json
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from engine.errors import BackendUnavailableError
from engine.requests import GenerateRequest, Soundtrack
from serving.backends.local import LocalBackend
from serving.backends.remote import RemoteBackend
from serving.cluster.answers import answer_from_json, answer_to_json
from serving.video import decode_mp4, encode_video, packed, video_file
from tests.support.app_server import serve_asgi, serve_routes
from tests.support.dit import local_engine
from tests.support.ltx2 import FPS, FRAMES
from tests.support.serve_handles import ReplicaHandle, front_end, replica_of, stand_in_ray
from tests.support.video import video_result

BODY = {
    "inputs": "a fox running through snow",
    "parameters": {"num_inference_steps": 2, "seed": 5, "num_frames": FRAMES, "fps": FPS, "width": 64, "height": 64},
}
KINDS = ("audio/wav", "video/mp4")


@pytest.fixture(scope="module")
def ltx2_engine(loaded_ltx2, tiny_ltx2_dir, base_settings) -> Iterator[Any]:
    settings = base_settings.replace(model_id=str(tiny_ltx2_dir), base_model_id=loaded_ltx2.base_model_id)
    with local_engine(loaded_ltx2, settings) as engine:
        yield engine


@pytest.fixture(scope="module")
def doors(ltx2_engine) -> Iterator[dict[str, str]]:
    """The base URL of each door: a single process's, the ingress's and a BACKEND_URL front end's."""
    monkeypatch = pytest.MonkeyPatch()
    stand_in_ray(monkeypatch)
    ingress, _ = front_end([ReplicaHandle(replica_of(ltx2_engine))], ltx2_engine.settings)
    try:
        with (
            serve_routes(LocalBackend.of(ltx2_engine)) as single,
            serve_asgi(ingress) as (cluster, _),
            serve_routes(RemoteBackend(cluster.rstrip("/"), timeout_s=300)) as remote,
        ):
            yield {"single": single, "ingress": cluster, "backend_url": remote}
    finally:
        monkeypatch.undo()


def _answer(url: str, kind: str) -> tuple[str, str, bytes]:
    response = httpx.post(url, json=BODY, headers={"accept": kind}, timeout=300)
    assert response.status_code == 200, response.text[:300]
    return response.headers["content-type"], response.headers.get("x-warnings", ""), response.content


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS)
def test_each_cluster_door_answers_as_a_single_process_does(doors, kind):
    single = _answer(doors["single"], kind)
    assert single[0] == kind
    for door in ("ingress", "backend_url"):
        assert _answer(doors[door], kind) == single, door


@pytest.mark.timeout(900)
def test_each_cluster_door_answers_the_webp_of_a_single_processs_mp4_saying_it_carries_no_sound(doors):
    """The cluster's WebP is made from the replica's MP4, the bytes one process answers for MP4: decoded and
    encoded again, it is the single process's MP4's WebP byte for byte (its frames and recipe), with one process's
    warnings (one process's own WebP, from the pipeline's frames, differs by H.264's loss)."""
    _, _, mp4 = _answer(doors["single"], "video/mp4")
    decoded = decode_mp4(mp4)
    expected = encode_video(decoded.frames, FPS, "image/webp", decoded.comment)
    kind, warnings, webp = _answer(doors["single"], "image/webp")
    assert kind == "image/webp" and "carries no sound" in warnings and len(decoded.frames) == FRAMES
    for door in ("ingress", "backend_url"):
        assert _answer(doors[door], "image/webp") == (kind, warnings, expected), door
    assert webp != expected, "one process makes its WebP from the pipeline's own frames, not the MP4's"


def test_the_wav_over_a_backend_url_is_the_clips_sound(doors):
    kind, warnings, wav = _answer(doors["backend_url"], "audio/wav")
    assert kind == "audio/wav" and "no sound" not in warnings
    with wave.open(io.BytesIO(wav)) as read:
        # The clip's length at the sound's rate: the waveform is padded to the frames' duration.
        assert read.getnframes() == round(FRAMES * read.getframerate() / FPS) and read.getsampwidth() == 2
    _, warned, _ = _answer(doors["backend_url"], "image/webp")
    assert "carries no sound" in warned


def test_a_videos_sound_crosses_the_wire_as_its_samples():
    """Without a pipeline: the replica's packed result, through JSON, answers the WAV a single process does; a
    sound whose samples do not make its shape is the backend's trouble."""
    made = video_result(GenerateRequest(prompt="a fox", num_frames=9, fps=24, seed=3))
    waveform = np.sin(np.linspace(0, 300, 2 * 8_000, dtype=np.float32)).reshape(2, -1) * 0.5
    made = dataclasses.replace(made, audio=Soundtrack(waveform, 24_000))
    document = json.loads(json.dumps(answer_to_json(packed(made, recipes=False))))
    back = answer_from_json(document)
    assert back.audio is not None and back.audio.rate == 24_000
    assert video_file(back, "audio/wav") == video_file(made, "audio/wav")
    document["audio"]["shape"] = [2, 7_999]
    with pytest.raises(BackendUnavailableError, match="does not make samples of shape"):
        answer_from_json(document)
