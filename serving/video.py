"""A video answer's file: H.264 MP4 (`yuv420p`, which every browser plays), or an animated WebP or GIF when the
client asks for one (`Accept`), each carrying the run's recipe.

The MP4 is written by PyAV (FFmpeg's libraries, libx264 among them, bundled in its wheels: no ffmpeg binary, no
subprocess; why PyAV: docs/internals.md, "serving/video.py"). Its recipe (A1111's `parameters` text,
`serving.recipes`) is the file's `comment` tag, the one FFmpeg, exiftool and PyAV read back from an MP4 (its
`©cmt` atom); the animated WebP carries it as the EXIF UserComment a still JPEG does, the GIF as its comment
extension. A GIF counts a frame's time in whole hundredths of a second, and browsers play a frame of less than 2
at 10 a second (Chromium's, Firefox's and WebKit's GIF decoders): each frame starts at its own time rounded to a
hundredth, at least 2 after the one before, so the clip keeps its length; above 50 fps it shows the frame playing
every 2 hundredths and drops the rest, which its answer's warnings say (`gif_timing`, `with_answer_notes`). The same
frames, fps and recipe give the same bytes (libx264 with `cpu-independent`, whatever the
thread or CPU; nothing time-dependent is written), which keeps every door's answer byte-identical.

A video with sound (`GenerateResult.audio`: LTX-2's) carries it in its MP4 as an AAC track starting with the first
frame (`serving.sound`); `Accept: audio/wav` answers the sound alone; an animated WebP or GIF has no sound, which
its answer's warnings say, as they say that a silent video asked for as WAV is answered as its MP4.

H.264 in 4:2:0 needs even sides: a frame with an odd width or height gets its last column or row repeated once
(FFmpeg's usual `pad` to even), so no pixel is lost and the video is at most one pixel wider or taller than its
frames. The pipelines' sides are multiples of 8 or 16, so this is only ever the case for hand-made frames.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

import av
from PIL import Image

from engine.errors import BackendUnavailableError
from engine.requests import GenerateResult, Soundtrack
from serving.recipes import KEY, with_recipes
from serving.sound import WAV, sound_stream, wav_file, write_sound

__all__ = [
    "ANIMATED_TYPES",
    "MP4",
    "VIDEO_TYPES",
    "DecodedVideo",
    "VideoType",
    "answer_type",
    "checked_mp4",
    "decode_mp4",
    "encode_video",
    "even_sides",
    "frame_count",
    "gif_timing",
    "packed",
    "unpacked",
    "video_file",
    "video_media_type",
    "with_answer_notes",
    "without_comment",
    "without_recipes",
]

MP4: Final = "video/mp4"
ANIMATED_TYPES = ("image/webp", "image/gif")
# Ties and an Accept naming none of them: MP4 (first here). WAV: a video's sound alone.
VIDEO_TYPES = (MP4, *ANIMATED_TYPES, WAV)
VideoType = Literal["video/mp4", "image/webp", "image/gif", "audio/wav"]
# libx264's constant-rate factor: 18 is visually lossless in x264's own guide (the default 23 blurs fine detail of
# LoRA styles); a 480p 81-frame clip stays a few MB.
_CRF = "18"
_PRESET = "medium"
_COMMENT = "comment"
# The MP4 (iTunes-style) item FFmpeg writes the `comment` tag as.
_CMT = b"\xa9cmt"
_WEBP_QUALITY = 90
_EXIF_IFD, _USER_COMMENT = 0x8769, 0x9286
# A GIF frame's shortest time that browsers play as written, in hundredths of a second.
_GIF_SHORTEST = 2
_UNICODE = b"UNICODE\x00"


@dataclass(frozen=True)
class DecodedVideo:
    """An MP4 read back: its frames (RGB), frame rate, and comment tag (the recipe; None without one)."""

    frames: tuple[Image.Image, ...]
    fps: Fraction
    comment: str | None


def video_media_type(accept: str | None) -> VideoType:
    """What a video answer is sent as: the first of `VIDEO_TYPES` ranked highest by `accept` (its q values);
    MP4 when it names none of them (`*/*`, `image/png`, or no header)."""
    quality = dict.fromkeys(VIDEO_TYPES, 0.0)
    for part in (accept or "").split(","):
        media, _, params = part.strip().partition(";")
        media = media.strip().lower()
        if media in quality:
            quality[media] = max(quality[media], _q(params))
    best = max(VIDEO_TYPES, key=lambda media: (quality[media], media == MP4))
    return best if quality[best] > 0 else MP4  # type: ignore[return-value]


def _q(params: str) -> float:
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def encode_video(
    frames: Sequence[Image.Image],
    fps: float,
    media_type: str = MP4,
    recipe: str | None = None,
    audio: Soundtrack | None = None,
) -> bytes:
    """The frames as `media_type` (`VIDEO_TYPES` but WAV) at `fps` frames a second, with `recipe` in its metadata
    and, in an MP4, `audio` as its sound track."""
    if not frames:
        raise ValueError("a video needs at least one frame")
    if fps <= 0:
        raise ValueError(f"fps must be above 0, got {fps}")
    if media_type == MP4:
        return _mp4(frames, fps, recipe, audio)
    if media_type in ANIMATED_TYPES:
        return _animated(frames, fps, media_type, recipe)
    raise ValueError(f"{media_type!r} is not a video type; accepted: {', '.join(VIDEO_TYPES)}")


def video_file(result: GenerateResult, media_type: str = MP4) -> bytes:
    """A video result's file: its frames at its fps, with the recipe its first frame holds (`with_recipes`; none
    when RECIPES=0). Every door answers these bytes. A result that crossed a cluster answers the MP4 its replica
    made (`packed`: the same bytes for the same frames and recipe) as it came, nothing decoded, and its WebP or GIF
    from that MP4's frames, decoded here (`unpacked`): the only door that needs them."""
    media_type = answer_type(result, media_type)
    if media_type == WAV and result.audio is not None:
        return wav_file(result.audio, frame_count(result), result.fps)
    if media_type == MP4 and result.video:
        return result.video
    frames = result.frames or unpacked(result).frames
    recipe = result.image.info.get(KEY)
    return encode_video(frames, result.fps, media_type, recipe if isinstance(recipe, str) else None, result.audio)


def answer_type(result: GenerateResult, media_type: str) -> str:
    """What a video result is answered as for `media_type`: itself, but MP4 for WAV where the video has no sound."""
    return MP4 if media_type == WAV and result.audio is None else media_type


def even_sides(image: Image.Image) -> Image.Image:
    """`image` with its last column and/or row repeated once where its width and/or height is odd."""
    width, height = image.size
    padded = (width + width % 2, height + height % 2)
    if padded == image.size:
        return image
    canvas = Image.new(image.mode, padded)
    canvas.paste(image, (0, 0))
    if width % 2:
        canvas.paste(image.crop((width - 1, 0, width, height)), (width, 0))
    if height % 2:
        canvas.paste(canvas.crop((0, height - 1, padded[0], height)), (0, height))
    return canvas


def _mp4(frames: Sequence[Image.Image], fps: float, recipe: str | None, audio: Soundtrack | None) -> bytes:
    first = even_sides(frames[0].convert("RGB"))
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        if recipe is not None:
            container.metadata[_COMMENT] = recipe
        # Every stream is added before the first packet is muxed (the header names them).
        sound = None if audio is None else sound_stream(container, audio)
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = first.size
        stream.pix_fmt = "yuv420p"
        # cpu-independent: x264's own switch for the same bytes on any CPU. Without it the bytes for the same
        # frames depended on the calling thread (on this AMD EPYC: 49 of 120 encodes from 3 threads differed;
        # none with it), and every door's answer must be the same bytes.
        stream.options = {"crf": _CRF, "preset": _PRESET, "x264-params": "cpu-independent=1"}
        for image in frames:
            frame = av.VideoFrame.from_image(even_sides(image.convert("RGB")))
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
        if sound is not None and audio is not None:
            write_sound(container, sound, audio, len(frames), fps)
    return buffer.getvalue()


def gif_timing(count: int, fps: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The frames a GIF of `count` frames at `fps` shows (their indices) and each one's time in hundredths of a
    second (module docstring): together the clip's length rounded to a hundredth (at least 2), each time at
    least 2."""
    total = max(_GIF_SHORTEST, round(count * 100 / fps))
    if fps * _GIF_SHORTEST <= 100:
        starts = [round(index * 100 / fps) for index in range(count)]
        return tuple(range(count)), tuple(b - a for a, b in zip(starts, [*starts[1:], total], strict=True))
    # A slot every 2 hundredths (the last takes what is left), each showing the frame playing as it starts.
    slots = total // _GIF_SHORTEST
    shown = tuple(min(count - 1, int(_GIF_SHORTEST * slot * fps / 100)) for slot in range(slots))
    return shown, (*([_GIF_SHORTEST] * (slots - 1)), total - _GIF_SHORTEST * (slots - 1))


def with_answer_notes(result: GenerateResult, media_type: str) -> GenerateResult:
    """`result` with what its answer's file (`media_type`) changes of the video among its warnings: a GIF that
    drops frames, an animated image without the video's sound, a silent video asked for as WAV."""
    if not result.is_video:
        return result
    result = _sound_notes(result, media_type)
    if media_type != "image/gif":
        return result
    count = len(result.frames) or result.request.num_frames
    shown, times = gif_timing(count, result.fps)
    if len(shown) == count:
        return result
    note = (
        f"the GIF shows {len(shown)} of the {count} frames: a GIF frame lasts whole hundredths of a second, at "
        f"least 2 (browsers play shorter ones at 10 a second), so {result.fps} fps plays at "
        f"{100 * len(shown) / sum(times):.3g} fps and the clip keeps its {sum(times) / 100:g} s; MP4 and WebP keep "
        "every frame"
    )
    return dataclasses.replace(result, warnings=(*result.warnings, note))


def _sound_notes(result: GenerateResult, media_type: str) -> GenerateResult:
    if media_type in ANIMATED_TYPES and result.audio is not None:
        kind = "WebP" if media_type == "image/webp" else "GIF"
        note = (
            f"the animated {kind} carries no sound: this video has a sound track, which its MP4 (Accept: video/mp4) "
            "carries, and Accept: audio/wav answers alone"
        )
    elif media_type == WAV and result.audio is None:
        note = "this video has no sound, so no WAV: its MP4 is answered (a video pool with sound answers audio/wav)"
    else:
        return result
    return dataclasses.replace(result, warnings=(*result.warnings, note))


def _animated(frames: Sequence[Image.Image], fps: float, media_type: str, recipe: str | None) -> bytes:
    """An animated WebP (lossy, at a fixed quality) or GIF (256 colours a frame, timed by `gif_timing`),
    looping."""
    images = [image.convert("RGB") for image in frames]
    buffer = io.BytesIO()
    options: dict[str, object] = {"save_all": True, "loop": 0}
    if media_type == "image/gif":
        shown, times = gif_timing(len(images), fps)
        images = [images[index] for index in shown]
        # PIL takes milliseconds and writes hundredths (`int(ms / 10)`).
        options["duration"] = [10 * time for time in times]
    else:
        options["duration"] = round(1000 / fps)
    options["append_images"] = images[1:]
    if media_type == "image/webp":
        if recipe is not None:
            exif = Image.Exif()
            exif.get_ifd(_EXIF_IFD)[_USER_COMMENT] = _UNICODE + recipe.encode("utf-16-be")
            options["exif"] = exif
        images[0].save(buffer, format="WEBP", quality=_WEBP_QUALITY, method=4, **options)
    else:
        if recipe is not None:
            options["comment"] = recipe.encode("utf-8")
        images[0].save(buffer, format="GIF", optimize=False, **options)
    return buffer.getvalue()


def decode_mp4(data: bytes) -> DecodedVideo:
    """An MP4's frames, frame rate and comment (PyAV: the library that wrote it, reading what a player reads)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        frames = tuple(frame.to_image() for frame in container.decode(stream))
        rate = stream.average_rate or stream.guessed_rate or Fraction(0)
        comment = container.metadata.get(_COMMENT)
    return DecodedVideo(frames, Fraction(rate), comment)


def packed(result: GenerateResult, recipes: bool) -> GenerateResult:
    """A video result as a cluster replica sends it: its MP4 (`video_file`, with its recipe unless `recipes` is
    off: the replica's RECIPES) in `video` and no frames (81 raw 832x480 frames are 97 MB, their MP4 a few MB:
    docs/cluster.md, "Video answers"); `image` stays the first frame as made. An image result as it is."""
    if not result.is_video:
        return result
    video = video_file(with_recipes(result) if recipes else result)
    return dataclasses.replace(result, frames=(), video=video)


def frame_count(result: GenerateResult) -> int:
    """A video's frames: those it holds, else (a cluster's MP4, undecoded) its request's, which its MP4 was checked
    to hold (`checked_mp4`); 0 for an image."""
    return len(result.frames) or (result.request.num_frames if result.video else 0)


def checked_mp4(result: GenerateResult) -> GenerateResult:
    """A `packed` result as it came, once its MP4 reads as a video of the frames its request made: its packets
    counted (H.264 sends one a frame), none decoded; decoding is for what needs pixels (`unpacked`). An MP4 that
    does not read, or holds other than those frames, is the backend's trouble."""
    if not result.video or result.frames:
        return result
    try:
        with av.open(io.BytesIO(result.video), mode="r") as container:
            stream = container.streams.video[0]
            count = sum(1 for packet in container.demux(stream) if packet.size)
    except (av.error.FFmpegError, IndexError) as e:
        raise BackendUnavailableError(f"the backend answered a video this Space cannot read ({e})") from e
    return _counted(result, count)


def unpacked(result: GenerateResult) -> GenerateResult:
    """A `packed` result with its frames again, decoded from its MP4 (lossy: H.264 at CRF 18), for what needs
    pixels (an animated WebP or GIF); its MP4 stays the answer. An MP4 that does not read, or holds other than the
    frames its request made, is the backend's trouble."""
    if not result.video or result.frames:
        return result
    try:
        frames = decode_mp4(result.video).frames
    except (av.error.FFmpegError, IndexError) as e:
        raise BackendUnavailableError(f"the backend answered a video this Space cannot read ({e})") from e
    return dataclasses.replace(_counted(result, len(frames)), frames=frames)


def _counted(result: GenerateResult, count: int) -> GenerateResult:
    if count != result.request.num_frames:
        raise BackendUnavailableError(
            f"the backend answered a video of {count} frames for a request of {result.request.num_frames}"
        )
    return result


def without_recipes(result: GenerateResult) -> GenerateResult:
    """A result whose MP4 came from a cluster's replica (which wrote the recipe by its own RECIPES) without that
    recipe, for a front end with RECIPES=0; anything else as it is (one process writes no recipe it is not asked
    for, and frames carry none)."""
    return dataclasses.replace(result, video=without_comment(result.video)) if result.video else result


def without_comment(data: bytes) -> bytes:
    """The MP4 without its `comment` tag (the recipe): the bytes an encode of the same frames without a recipe
    makes. FFmpeg writes the tag as the `©cmt` item of `moov/udta/meta/ilst`, after `mdat`: that item is cut out
    and the four boxes around it shrink by its size (no sample moves, so no offset changes). A file laid out
    otherwise (its `moov` first, a 64-bit box size) is copied stream by stream instead (PyAV, no re-encoding),
    which leaves every tag behind. A file without the tag is returned as it is."""
    path: list[tuple[int, int]] = []
    start, end = 0, len(data)
    for kind in (b"moov", b"udta", b"meta", b"ilst", _CMT):
        found = _boxes(data, start, end).get(kind)
        if found is None:
            return data  # no comment: nothing to take out
        at, size = found
        if size < 8:
            return _remuxed(data)
        path.append(found)
        start, end = at + (12 if kind == b"meta" else 8), at + size  # `meta` is a full box: version and flags
    mdat = _boxes(data, 0, len(data)).get(b"mdat")
    if mdat is None or mdat[0] > path[0][0]:
        return _remuxed(data)
    cut_at, cut = path[-1]
    out = bytearray(data[:cut_at] + data[cut_at + cut :])
    for at, size in path[:-1]:
        struct.pack_into(">I", out, at, size - cut)
    return bytes(out)


def _boxes(data: bytes, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    """The boxes between `start` and `end`: each kind's first (offset, size); a 64-bit or to-the-end size is 0."""
    found: dict[bytes, tuple[int, int]] = {}
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, at)
        found.setdefault(kind, (at, size if size >= 8 else 0))
        if size < 8:
            break
        at += size
    return found


def _remuxed(data: bytes) -> bytes:
    out = io.BytesIO()
    with av.open(io.BytesIO(data), mode="r") as source, av.open(out, mode="w", format="mp4") as target:
        stream = source.streams.video[0]
        copy = target.add_stream_from_template(stream)
        for packet in source.demux(stream):
            if packet.dts is not None:
                packet.stream = copy
                target.mux(packet)
    return out.getvalue()
