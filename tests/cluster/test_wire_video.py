"""A video answer on the cluster, without Ray: the replica sends the MP4 it made (`packed`), the ingress passes it
on the wire, the front end answers those bytes (a single process's, byte for byte) and decodes the frames from
them only for what needs pixels (an animated WebP or GIF); with RECIPES=0 it takes the replica's recipe out of
them, which leaves a single process's RECIPES=0 bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from typing import Any

import av
import pytest
from PIL import Image

from engine.errors import BackendUnavailableError
from engine.events import EngineEvents
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, Timings
from engine.settings import Settings
from serving import video as video_module
from serving.cluster.answers import answer_from_json, answer_to_json
from serving.handlers import Handlers
from serving.recipes import with_recipes
from serving.ui.video_api import video_info
from serving.video import (
    checked_mp4,
    decode_mp4,
    encode_video,
    frame_count,
    packed,
    unpacked,
    video_file,
    without_comment,
)
from tests.support.video import TOLERANCE, frames, mean_difference, video_result


def _over_the_cluster(result: GenerateResult) -> tuple[dict[str, object], GenerateResult]:
    """The replica packs it, the ingress checks it (`ServeBackend`) and adds recipes (`Handlers`), the wire
    carries it as JSON, the front end reads it and adds its recipes."""
    sent = packed(result, recipes=True)
    assert sent.frames == () and sent.video
    at_ingress = with_recipes(checked_mp4(dataclasses.replace(sent, served_by="replica-1")))
    document = json.loads(json.dumps(answer_to_json(at_ingress)))
    return document, with_recipes(answer_from_json(document))


def test_a_video_crosses_as_its_mp4_and_the_front_end_answers_the_same_bytes():
    result = video_result(GenerateRequest(prompt="a fox", num_frames=5, fps=8, seed=3, guidance_2=2.5))
    document, back = _over_the_cluster(result)
    assert "frames" not in document
    single = with_recipes(result)
    assert video_file(back) == video_file(single)
    assert back.is_video and back.fps == 8 and frame_count(back) == 5
    assert back.request == result.request and back.served_by == "replica-1"
    # The first frame as made (lossless); the others, where pixels are needed, decoded from the MP4 (H.264,
    # within its tolerance).
    assert back.image.tobytes() == result.image.tobytes()
    for decoded, made in zip(unpacked(back).frames, result.frames, strict=True):
        assert mean_difference(decoded, made) < TOLERANCE
    assert decode_mp4(video_file(back)).comment == single.image.info["parameters"]


def test_the_front_end_decodes_the_mp4_only_for_an_animated_answer(monkeypatch):
    decoded: list[int] = []
    decode = video_module.decode_mp4
    monkeypatch.setattr(video_module, "decode_mp4", lambda data: decoded.append(len(data)) or decode(data))
    result = video_result(GenerateRequest(prompt="a fox", num_frames=9, fps=16, seed=1))
    _, back = _over_the_cluster(result)
    assert back.frames == () and frame_count(back) == 9
    assert video_file(back) == back.video and decoded == [], "an MP4 answer is the replica's bytes, undecoded"
    # What the UI and /generate_video tell of it come from the checked count, not from decoded frames.
    info = video_info(with_recipes(back))
    assert (info["num_frames"], info["duration_s"]) == (9, 9 / 16) and decoded == []
    gif = Image.open(io.BytesIO(video_file(back, "image/gif")))
    assert gif.n_frames == 9 and decoded == [len(back.video)], "a GIF needs the frames: decoded once, for it"


class Answering:
    """A front end's backend answering what came over the wire (`answer_from_json` of `document`)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document, self.events = document, EngineEvents()

    async def generate(self, request: GenerateRequest, **kwargs: object) -> GenerateResult:
        return answer_from_json(self.document)


def test_with_recipes_off_the_front_end_answers_a_single_process_mp4_without_the_replicas_recipe():
    result = video_result(GenerateRequest(prompt="a fox", num_frames=5, fps=8, seed=3))
    document, _ = _over_the_cluster(result)  # the replica wrote its recipe into the MP4 (its RECIPES on)
    handlers = Handlers(Answering(document), None, Settings(recipes=False))  # type: ignore[arg-type]
    back = asyncio.run(handlers.generate(GenerateRequest(prompt="a fox")))
    answered = video_file(back)
    assert decode_mp4(answered).comment is None
    assert answered == video_file(result), "a single process's RECIPES=0 MP4, byte for byte"
    with_them = Handlers(Answering(document), None, Settings(recipes=True))  # type: ignore[arg-type]
    kept = video_file(asyncio.run(with_them.generate(GenerateRequest(prompt="a fox"))))
    assert decode_mp4(kept).comment == with_recipes(result).image.info["parameters"]


def test_a_recipe_before_the_samples_is_left_behind_by_copying_the_stream(tmp_path):
    """An MP4 laid out otherwise than FFmpeg's default (`moov` before `mdat`: `faststart`) loses its comment by a
    stream copy: the same packets, nothing re-encoded."""
    made = encode_video(frames(7), 16, recipe="a fox\nSteps: 2")
    path = tmp_path / "faststart.mp4"
    with av.open(io.BytesIO(made)) as source, av.open(str(path), "w", format="mp4", options=FASTSTART) as target:
        target.metadata["comment"] = "a fox\nSteps: 2"
        stream = source.streams.video[0]
        copy = target.add_stream_from_template(stream)
        for packet in source.demux(stream):
            if packet.dts is not None:
                packet.stream = copy
                target.mux(packet)
    first = path.read_bytes()
    assert first.find(b"moov") < first.find(b"mdat") and decode_mp4(first).comment == "a fox\nSteps: 2"
    bare = without_comment(first)
    assert decode_mp4(bare).comment is None
    assert _packets(bare) == _packets(made)
    assert without_comment(bare) == bare


FASTSTART = {"movflags": "faststart"}


def _packets(data: bytes) -> list[bytes]:
    with av.open(io.BytesIO(data)) as container:
        return [bytes(p) for p in container.demux(container.streams.video[0]) if p.size]


def test_an_animated_webp_over_the_cluster_is_made_from_the_mp4s_frames():
    result = video_result(GenerateRequest(prompt="a fox", num_frames=9, fps=16, seed=1))
    _, back = _over_the_cluster(result)
    webp = Image.open(io.BytesIO(video_file(back, "image/webp")))
    assert webp.format == "WEBP" and webp.n_frames == 9


def test_an_image_answer_has_no_video():
    image = Image.new("RGB", (8, 8), (5, 6, 7))
    result = GenerateResult(image, 1, CheckedRequest(prompt="x", width=8, height=8), Timings())
    assert packed(result, recipes=True) is result
    document = json.loads(json.dumps(answer_to_json(result)))
    assert document["video"] == ""
    back = answer_from_json(document)
    assert not back.is_video and back.fps == 0 and back.image.getpixel((0, 0)) == (5, 6, 7)


def test_an_unreadable_or_short_video_is_backend_trouble():
    document = json.loads(json.dumps(answer_to_json(video_result(GenerateRequest(prompt="a fox", num_frames=5)))))
    with pytest.raises(BackendUnavailableError, match="cannot read"):
        answer_from_json({**document, "video": "aGVsbG8="})
    three = answer_to_json(video_result(GenerateRequest(prompt="a fox", num_frames=3)))
    with pytest.raises(BackendUnavailableError, match="3 frames for a request of 5"):
        answer_from_json({**document, "video": three["video"]})
    with pytest.raises(BackendUnavailableError, match="unreadable"):
        answer_from_json({"result": document["result"]})
