"""A video answer on the cluster, without Ray: the replica sends the MP4 it made (`packed`), the ingress passes it
on the wire, the front end answers those bytes (a single process's, byte for byte) and decodes the frames from
them for what needs pixels (an animated WebP or GIF)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from PIL import Image

from engine.errors import BackendUnavailableError
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, Timings
from serving.cluster.answers import answer_from_json, answer_to_json
from serving.recipes import with_recipes
from serving.video import decode_mp4, packed, unpacked, video_file
from tests.support.video import TOLERANCE, mean_difference, video_result


def _over_the_cluster(result: GenerateResult) -> tuple[dict[str, object], GenerateResult]:
    """The replica packs it, the ingress unpacks it (`ServeBackend`) and adds recipes (`Handlers`), the wire
    carries it as JSON, the front end reads it and adds its recipes."""
    sent = packed(result, recipes=True)
    assert sent.frames == () and sent.video
    at_ingress = with_recipes(unpacked(dataclasses.replace(sent, served_by="replica-1")))
    document = json.loads(json.dumps(answer_to_json(at_ingress)))
    return document, with_recipes(answer_from_json(document))


def test_a_video_crosses_as_its_mp4_and_the_front_end_answers_the_same_bytes():
    result = video_result(GenerateRequest(prompt="a fox", num_frames=5, fps=8, seed=3, guidance_2=2.5))
    document, back = _over_the_cluster(result)
    assert "frames" not in document
    single = with_recipes(result)
    assert video_file(back) == video_file(single)
    assert back.is_video and back.fps == 8 and len(back.frames) == 5
    assert back.request == result.request and back.served_by == "replica-1"
    # The first frame as made (lossless); the others decoded from the MP4 (H.264, within its tolerance).
    assert back.image.tobytes() == result.image.tobytes()
    for decoded, made in zip(back.frames, result.frames, strict=True):
        assert mean_difference(decoded, made) < TOLERANCE
    assert decode_mp4(video_file(back)).comment == single.image.info["parameters"]


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
