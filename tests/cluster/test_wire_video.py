"""A video answer on the cluster's wire, without Ray: its frames cross as PNG files (lossless) with its fps, so
the front end's MP4 is the bytes a single process writes for the same result."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from engine.errors import BackendUnavailableError
from engine.requests import CheckedRequest, GenerateRequest, GenerateResult, Timings
from serving.cluster.answers import answer_from_json, answer_to_json
from serving.video import video_file
from tests.support.video import video_result


def test_a_video_crosses_as_its_frames_and_encodes_to_the_same_bytes():
    result = video_result(GenerateRequest(prompt="a fox", num_frames=5, fps=8, seed=3, guidance_2=2.5))
    document = json.loads(json.dumps(answer_to_json(result)))
    assert len(document["frames"]) == 5
    back = answer_from_json(document)
    assert back.is_video and back.fps == 8
    assert back.request == result.request
    for crossed, made in zip(back.frames, result.frames, strict=True):
        assert np.array_equal(np.asarray(crossed), np.asarray(made))
    assert np.array_equal(np.asarray(back.image), np.asarray(result.frames[0]))
    assert video_file(back) == video_file(result)
    assert video_file(back, "image/webp") == video_file(result, "image/webp")


def test_an_image_answer_has_no_frames():
    image = Image.new("RGB", (8, 8), (5, 6, 7))
    result = GenerateResult(image, 1, CheckedRequest(prompt="x", width=8, height=8), Timings())
    document = json.loads(json.dumps(answer_to_json(result)))
    assert document["frames"] == []
    back = answer_from_json(document)
    assert not back.is_video and back.fps == 0 and back.image.getpixel((0, 0)) == (5, 6, 7)


def test_an_unreadable_frame_is_backend_trouble():
    document = answer_to_json(video_result(GenerateRequest(prompt="a fox", num_frames=5)))
    with pytest.raises(BackendUnavailableError, match="cannot read"):
        answer_from_json({**document, "frames": [document["frames"][0], "aGVsbG8="]})
    with pytest.raises(BackendUnavailableError, match="unreadable"):
        answer_from_json({"result": document["result"]})
