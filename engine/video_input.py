"""The reference video a request brings (`GenerateRequest.reference_video`: an IC-LoRA's, LTX-2's in-context
pipeline): an `EncodedVideo` (the MP4 as sent, read only as far as its header) or an `InputVideo` (its frames).

Gate, then decode, as for images (`engine.images`): every door carries the client's file into the request as an
`EncodedVideo` (`encoded_video`), whose facts come from the MP4's boxes alone, walked here in Python (no codec and
no demuxer touches the bytes: FFmpeg's stream probing decodes frames to learn a stream's pixel format): the file is
an MP4 (an `ftyp` box first), every top-level box lies within the bytes sent (else: a truncated MP4), its `moov`
holds a video track, whose codec is one PyAV decodes here (`CODECS`), whose sample count (its frames), length in
seconds and sample size are read from `stsz`, `mdhd` and `stsd`. The door holds the frames to MAX_VIDEO_FRAMES and
a frame's pixels to MAX_INPUT_PIXELS; `normalise_request` holds them again with the pool's own limits (its longest
clip) and only then decodes (`decode_video`), at most the header's frames. A box walk stops after `_MOST_BOXES`
boxes: a container of millions of empty boxes (a zip bomb's shape) costs that many steps, not its size.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError, LimitExceededError
from engine.images import InputImage

__all__ = [
    "ACCEPTED_VIDEO",
    "CODECS",
    "MOST_VIDEO_FRAMES",
    "EncodedVideo",
    "InputVideo",
    "RequestVideo",
    "check_video_size",
    "decode_video",
    "encoded_video",
    "file_of",
]

# The sample entries (`stsd`) of the codecs PyAV's wheel decodes here, and their names in refusals.
CODECS = {b"avc1": "H.264", b"avc3": "H.264", b"hvc1": "HEVC", b"hev1": "HEVC", b"vp09": "VP9", b"av01": "AV1"}
ACCEPTED_VIDEO = "an MP4 video (H.264, HEVC, VP9 or AV1) in base64, with or without a data:video/mp4;base64, prefix"
# MAX_VIDEO_FRAMES' ceiling (engine.settings): the most frames a door that does not know the setting lets through.
MOST_VIDEO_FRAMES = 1001
# Boxes walked in all before a file is refused as a malformed container (a real MP4 has some tens).
_MOST_BOXES = 4096
# Boxes whose children are boxes, on the way to a video track's facts.
_CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl")


@dataclass(frozen=True)
class EncodedVideo:
    """An MP4 as a client sent it (`data`, compared by its bytes) with what its header says: its codec's name, its
    first video track's frame size, frames and length in seconds. `what` names it in refusals (not compared)."""

    data: bytes = field(repr=False)
    codec: str
    width: int
    height: int
    frames: int
    seconds: float
    what: str = field(default="video", compare=False)

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class InputVideo:
    """A reference video's frames (8-bit RGB, in order) at `fps`, decoded from `source` (the file, not compared)."""

    frames: tuple[InputImage, ...]
    fps: float
    source: bytes = field(default=b"", repr=False, compare=False)


RequestVideo = EncodedVideo | InputVideo


def file_of(video: RequestVideo) -> bytes:
    """The MP4 a request's video came as (a decoded one keeps its file)."""
    data = video.data if isinstance(video, EncodedVideo) else video.source
    if not data:
        raise ValueError("a reference video made in code has no file to send")
    return data


@dataclass
class _Track:
    codec: bytes = b""
    width: int = 0
    height: int = 0
    frames: int = 0
    timescale: int = 0
    duration: int = 0
    video: bool = False


def _refused(what: str, rule: str) -> InvalidRequestError:
    return InvalidRequestError(f"{what} {rule}; accepted: {ACCEPTED_VIDEO}")


def _boxes(data: bytes, start: int, end: int, what: str, budget: list[int]) -> list[tuple[bytes, int, int]]:
    """The boxes from `start` to `end`: (kind, payload start, box end); a box past `end` is a truncated MP4."""
    found = []
    at = start
    while at < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise _refused(what, f"is a container of more than {_MOST_BOXES} boxes (not a video file's shape)")
        if at + 8 > end:
            raise _refused(what, f"is a truncated MP4 (a box header cut at byte {end})")
        size, kind = struct.unpack_from(">I4s", data, at)
        head = 8
        if size == 1:
            if at + 16 > end:
                raise _refused(what, f"is a truncated MP4 (a box header cut at byte {end})")
            size, head = struct.unpack_from(">Q", data, at + 8)[0], 16
        elif size == 0:
            size = end - at
        if size < head or at + size > end:
            shown = kind.decode("latin-1")
            raise _refused(what, f"is a truncated MP4 (its {shown!r} box needs {size} bytes, {end - at} were sent)")
        found.append((kind, at + head, at + size))
        at += size
    return found


def _read_track(data: bytes, start: int, end: int, track: _Track, what: str, budget: list[int]) -> None:
    """Fill `track` from a `trak` box's descendants (handler, media header, sample description and sizes)."""
    for kind, at, stop in _boxes(data, start, end, what, budget):
        try:
            if kind in _CONTAINERS:
                _read_track(data, at, stop, track, what, budget)
            elif kind == b"hdlr":
                track.video = data[at + 8 : at + 12] == b"vide"
            elif kind == b"mdhd":
                long = data[at] == 1
                track.timescale, track.duration = struct.unpack_from(
                    ">IQ" if long else ">II", data, at + (20 if long else 12)
                )
            elif kind == b"stsd":
                track.codec = data[at + 12 : at + 16]
                track.width, track.height = struct.unpack_from(">HH", data, at + 8 + 8 + 24)
            elif kind == b"stsz":
                track.frames = struct.unpack_from(">I", data, at + 8)[0]
        except struct.error as e:
            raise _refused(what, f"is a truncated MP4 (its {kind.decode('latin-1')!r} box is cut short)") from e


def encoded_video(data: bytes, *, what: str, max_pixels: int, max_frames: int) -> EncodedVideo:
    """`data` as an MP4 read as far as its header (see the module docstring); refusals name `what` and the rule."""
    if len(data) < 12 or data[4:8] != b"ftyp":
        raise _refused(what, f"is not a video ({len(data)} bytes that do not start as an MP4's ftyp box)")
    budget = [_MOST_BOXES]
    top = _boxes(data, 0, len(data), what, budget)
    moov = [(at, stop) for kind, at, stop in top if kind == b"moov"]
    if not moov:
        raise _refused(what, "is a truncated MP4 (no moov box: the header that says what it holds)")
    tracks = []
    for kind, at, stop in _boxes(data, *moov[0], what, budget):
        if kind == b"trak":
            tracks.append(_Track())
            _read_track(data, at, stop, tracks[-1], what, budget)
    video = next((track for track in tracks if track.video), None)
    if video is None:
        raise _refused(what, "is not a video (its MP4 has no video track)")
    if video.codec not in CODECS:
        raise _refused(what, f"is a video in {video.codec.decode('latin-1')!r}, a codec not read here")
    seconds = video.duration / video.timescale if video.timescale else 0.0
    if video.frames < 1 or video.width < 1 or video.height < 1 or seconds <= 0:
        raise _refused(what, "is not a video (its header states no frames, size or duration)")
    encoded = EncodedVideo(data, CODECS[video.codec], video.width, video.height, video.frames, seconds, what)
    check_video_size(encoded, max_pixels=max_pixels, max_frames=max_frames)
    return encoded


def check_video_size(video: EncodedVideo, *, max_pixels: int, max_frames: int, max_seconds: float = 0.0) -> None:
    """The header's frames within `max_frames` (MAX_VIDEO_FRAMES) and `max_seconds` (the pool's longest clip; 0: no
    bound), a frame's pixels within `max_pixels` (MAX_INPUT_PIXELS): a LimitExceededError naming the rule."""
    what = video.what
    if video.frames > max_frames:
        raise LimitExceededError(
            f"{what} is too long: {video.frames} frames; accepted: {ACCEPTED_VIDEO}, of at most {max_frames} frames"
        )
    if max_seconds and video.seconds > max_seconds:
        raise LimitExceededError(
            f"{what} is too long: {video.seconds:.2f} s; accepted: {ACCEPTED_VIDEO}, of at most {max_seconds:g} s"
        )
    if video.pixels > max_pixels:
        raise LimitExceededError(
            f"{what} has too many pixels: {video.width}x{video.height} ({video.pixels:,}) a frame; accepted: "
            f"{ACCEPTED_VIDEO}, of at most {max_pixels:,} pixels a frame (MAX_INPUT_PIXELS)"
        )


def decode_video(video: EncodedVideo) -> InputVideo:
    """The frames of a video `encoded_video` read (at most the header's count), as RGB images: PyAV, once gated."""
    import av  # the decoder only once the header was gated (and not at import: the engine's light modules)

    frames: list[InputImage] = []
    try:
        with av.open(io.BytesIO(video.data), mode="r", format="mp4") as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or video.frames / video.seconds
            for frame in container.decode(stream):
                image = frame.to_image().convert("RGB")
                frames.append(InputImage(image.width, image.height, "RGB", image.tobytes()))
                if len(frames) >= video.frames:
                    break
    except (av.FFmpegError, ValueError, IndexError) as e:
        raise _refused(video.what, f"could not be decoded ({type(e).__name__}: {e})") from e
    if not frames:
        raise _refused(video.what, "could not be decoded (no frame came out)")
    return InputVideo(tuple(frames), rate, video.data)
