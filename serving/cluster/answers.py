"""A generation's answer on the cluster's wire (`serving.cluster.wire` holds its parts): the ingress sends it, a
front end's RemoteBackend reads it. No ray, no gradio: both sides import this."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import BackendUnavailableError
from engine.requests import GenerateResult
from serving.cluster.wire import decode_png, encode_png, result_from_json, result_to_json

__all__ = ["answer_from_json", "answer_to_json"]


def answer_to_json(result: GenerateResult) -> dict[str, Any]:
    """The ingress's answer to a generation: the first image and the rest as PNG files, a video's frames as PNG
    files too (`frames`, in order; the first is `image` again), and the rest of the result.

    A video crosses as its frames, losslessly, not as the MP4: the front end encodes what its door was asked for
    (MP4, or the animated WebP or GIF an Accept header prefers) from the pixels the pipeline made, with its own
    recipe setting, so its answer is the one a single process gives, byte for byte, and never a re-encoding of a
    lossy file. The cost is size: a PNG frame of 832x480 is some hundreds of KB against a few KB per frame in the
    MP4 (docs/internals.md, "serving/cluster/wire.py")."""
    return {
        "image": encode_png(result.image),
        "more_images": [encode_png(image) for image in result.more_images],
        "frames": [encode_png(frame) for frame in result.frames],
        "result": result_to_json(result),
    }


def answer_from_json(document: Mapping[str, Any]) -> GenerateResult:
    """The result `answer_to_json` sent."""
    try:
        more = [decode_png(png) for png in document.get("more_images") or ()]
        frames = [decode_png(png) for png in document.get("frames") or ()]
        return result_from_json(document["result"], decode_png(document["image"]), more, frames)
    except (KeyError, TypeError, AttributeError) as e:
        raise BackendUnavailableError(f"the backend answered something unreadable: {type(e).__name__}: {e}") from e
