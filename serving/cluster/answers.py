"""A generation's answer on the cluster's wire (`serving.cluster.wire` holds its parts): the ingress sends it, a
front end's RemoteBackend reads it. No ray, no gradio: both sides import this."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from engine.errors import BackendUnavailableError
from engine.requests import GenerateResult
from serving.cluster.wire import decode_png, encode_png, result_from_json, result_to_json
from serving.video import checked_mp4, video_file

__all__ = ["answer_from_json", "answer_to_json"]


def answer_to_json(result: GenerateResult) -> dict[str, Any]:
    """The ingress's answer to a generation: the first image and the rest as PNG files, a video's MP4 (`video`,
    base64; empty for images), and the rest of the result.

    A video crosses as the MP4 its replica made (`serving.video.packed`: the bytes a single process answers for
    the same frames and recipe), not as its frames: 81 PNG frames of 832x480 are tens of MB, the MP4 a few
    (docs/cluster.md, "Video answers"). The front end answers those bytes for MP4, and decodes the frames from
    them only for what needs pixels (an animated WebP or GIF: lossy, from the MP4's frames). `image` is the first
    frame as the pipeline made it."""
    video = result.video or (video_file(result) if result.is_video else b"")
    return {
        "image": encode_png(result.image),
        "more_images": [encode_png(image) for image in result.more_images],
        "video": base64.b64encode(video).decode("ascii"),
        "result": result_to_json(result),
    }


def answer_from_json(document: Mapping[str, Any]) -> GenerateResult:
    """The result `answer_to_json` sent; a video's MP4 checked to hold its request's frames, none decoded (that
    waits for a door that needs pixels: `serving.video.video_file`)."""
    try:
        more = [decode_png(png) for png in document.get("more_images") or ()]
        video = decode_png(document.get("video") or "")
        result = result_from_json(document["result"], decode_png(document["image"]), more, video)
    except (KeyError, TypeError, AttributeError) as e:
        raise BackendUnavailableError(f"the backend answered something unreadable: {type(e).__name__}: {e}") from e
    return checked_mp4(result)
