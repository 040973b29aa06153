"""An IC-LoRA's reference video on the cluster's wire: the client's MP4 crosses as its bytes, read on arrival only
as far as its header (the same gate as every door), and a checked request's comes back decoded (what ran)."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidRequestError
from engine.requests import CheckedRequest, GenerateRequest
from engine.video_input import EncodedVideo, decode_video, encoded_video
from serving.cluster.wire import _CheckedJson, request_from_json, request_to_json
from tests.support.reference_video import reference_mp4

MP4 = reference_mp4(frames=9, side=32)


def test_a_reference_video_crosses_as_its_file_and_comes_back_equal():
    video = encoded_video(MP4, what="parameters.video", max_pixels=10**6, max_frames=81)
    request = GenerateRequest(prompt="a fox", reference_video=video)
    back = request_from_json(json.loads(json.dumps(request_to_json(request))))
    assert back == request and isinstance(back.reference_video, EncodedVideo)
    checked = CheckedRequest(prompt="a fox", reference_video=decode_video(video))
    document = json.loads(json.dumps(request_to_json(checked)))
    ran = _CheckedJson.model_validate(document).checked(10**6)  # type: ignore[attr-defined]
    assert ran.reference_video == checked.reference_video and ran.reference_video.source == MP4


def test_a_bad_video_on_the_wire_is_refused_by_its_rule():
    document = request_to_json(GenerateRequest(prompt="a fox"))
    document["reference_video"] = {"file": "AAAA"}
    with pytest.raises(InvalidRequestError, match=r"reference_video is not a video"):
        request_from_json(document)
