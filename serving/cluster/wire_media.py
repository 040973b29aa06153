"""A request's images and reference video on the cluster's wire (`serving.cluster.wire`): each the client's own
file, base64 (an image made in code: a PNG of its pixels), read on arrival only as far as its header
(`engine.images.encoded_image`, `engine.video_input.encoded_video`) as on every door, and decoded where it is a
checked request's (what ran). Kept apart so that the wire's module stays small."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine.errors import InvalidRequestError
from engine.images import ACCEPTED, DEFAULT_MAX_INPUT_PIXELS, RequestImage, encoded_image
from engine.images import file_of as image_file
from engine.video_input import ACCEPTED_VIDEO, MOST_VIDEO_FRAMES, RequestVideo, decode_video, encoded_video, file_of

__all__ = ["ImageJson", "VideoJson", "image_json", "video_json"]

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class ImageJson(BaseModel):
    """An image on the wire: its mode and its file (PNG, JPEG or WebP: the client's own, or a PNG of its pixels),
    base64; the same pixels back."""

    model_config = _STRICT

    mode: Literal["RGB", "L"]
    file: str

    def image(self, what: str, max_pixels: int, *, decode: bool) -> RequestImage:
        """The file read as far as its header, as a door reads one; decoded too where `decode` (what a checked
        request ran on: its images are pixels)."""
        try:
            data = base64.b64decode(self.file, validate=True)
        except ValueError as e:
            raise InvalidRequestError(f"{what} on the wire is not base64 ({e}); accepted: {ACCEPTED} in base64") from e
        encoded = encoded_image(data, what=what, max_pixels=max_pixels, mode=self.mode)
        return encoded.decoded(max_pixels) if decode else encoded


def image_json(image: RequestImage | None) -> dict[str, Any] | None:
    if image is None:
        return None
    return {"mode": image.mode, "file": base64.b64encode(image_file(image)).decode("ascii")}


class VideoJson(BaseModel):
    """A reference video on the wire: its MP4, base64. The engine holds its frames to the pool's own limits."""

    model_config = _STRICT

    file: str

    def video(self, what: str, max_pixels: int = DEFAULT_MAX_INPUT_PIXELS, *, decode: bool) -> RequestVideo:
        try:
            data = base64.b64decode(self.file, validate=True)
        except ValueError as e:
            raise InvalidRequestError(f"{what} on the wire is not base64 ({e}); accepted: {ACCEPTED_VIDEO}") from e
        # MOST_VIDEO_FRAMES: MAX_VIDEO_FRAMES' ceiling; the engine's check holds the Space's own setting.
        encoded = encoded_video(data, what=what, max_pixels=max_pixels, max_frames=MOST_VIDEO_FRAMES)
        return decode_video(encoded) if decode else encoded


def video_json(video: RequestVideo | None) -> dict[str, Any] | None:
    return None if video is None else {"file": base64.b64encode(file_of(video)).decode("ascii")}
