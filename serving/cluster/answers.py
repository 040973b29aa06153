"""A generation's answer on the cluster's wire (`serving.cluster.wire` holds its parts): the ingress sends it, a
front end's RemoteBackend reads it. No ray, no gradio: both sides import this."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.errors import BackendUnavailableError
from engine.requests import GenerateResult, Soundtrack
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
    frame as the pipeline made it.

    A video's sound (`audio`: LTX-2's) crosses as its samples too (float32, a few hundred KB for a clip, beside an
    MP4 that already carries it as AAC): the front end answers `Accept: audio/wav` from them as a single process
    does (the same samples give the same WAV), and says what an animated answer leaves out; decoding the MP4's AAC
    would give other samples (AAC is lossy). None for a silent video or an image."""
    video = result.video or (video_file(result) if result.is_video else b"")
    return {
        "image": encode_png(result.image),
        "more_images": [encode_png(image) for image in result.more_images],
        "video": base64.b64encode(video).decode("ascii"),
        "audio": None if result.audio is None else _sound_to_json(result.audio),
        "result": result_to_json(result),
    }


def _sound_to_json(sound: Soundtrack) -> dict[str, Any]:
    samples = np.ascontiguousarray(np.asarray(sound.samples, dtype="<f4"))
    return {
        "rate": sound.rate,
        "shape": list(samples.shape),
        "samples": base64.b64encode(samples.tobytes()).decode("ascii"),
    }


def _sound_from_json(document: Mapping[str, Any] | None) -> Soundtrack | None:
    """The sound `_sound_to_json` sent; samples that do not make its shape, or a rate not above 0, are the
    backend's trouble."""
    if document is None:
        return None
    shape = tuple(int(side) for side in document["shape"])
    data = base64.b64decode(document["samples"], validate=True)
    rate = int(document["rate"])
    if not 1 <= len(shape) <= 2 or rate <= 0 or len(data) != 4 * int(np.prod(shape)):
        raise ValueError(f"a sound of {len(data)} bytes at {rate} a second does not make samples of shape {shape}")
    return Soundtrack(np.frombuffer(data, dtype="<f4").reshape(shape).astype(np.float32), rate)


def answer_from_json(document: Mapping[str, Any]) -> GenerateResult:
    """The result `answer_to_json` sent; a video's MP4 checked to hold its request's frames, none decoded (that
    waits for a door that needs pixels: `serving.video.video_file`)."""
    try:
        more = [decode_png(png) for png in document.get("more_images") or ()]
        video = decode_png(document.get("video") or "")
        result = result_from_json(document["result"], decode_png(document["image"]), more, video)
        audio = _sound_from_json(document.get("audio"))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise BackendUnavailableError(f"the backend answered something unreadable: {type(e).__name__}: {e}") from e
    return checked_mp4(dataclasses.replace(result, audio=audio) if audio is not None else result)
