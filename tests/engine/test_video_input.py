"""The reference video's gate (`engine.video_input`): an MP4's codec, size, frames and length read from its boxes
alone, equal to what PyAV's demuxer reads from the same file; each bad file refused by its rule (not a video, too
long, too many pixels, a truncated MP4, a container of endless boxes) before any library reads the bytes."""

from __future__ import annotations

import io
import struct

import av
import pytest

from engine.errors import InvalidRequestError, LimitExceededError
from engine.video_input import CODECS, check_video_size, decode_video, encoded_video
from tests.support.image_inputs import example_image, png_bytes
from tests.support.reference_video import endless_boxes, reference_mp4, with_codec

MP4 = reference_mp4(frames=9, side=64)


def read(data: bytes, pixels: int = 10**6, frames: int = 81):
    return encoded_video(data, what="parameters.video", max_pixels=pixels, max_frames=frames)


def test_the_header_says_what_pyavs_demuxer_says():
    video = read(MP4)
    with av.open(io.BytesIO(MP4)) as container:
        stream = container.streams.video[0]
        assert (video.width, video.height, video.frames) == (stream.width, stream.height, stream.frames)
        assert video.codec == "H.264" and stream.codec_context.name == "h264"
        assert video.seconds == pytest.approx(float(stream.duration * stream.time_base))
    decoded = decode_video(video)
    assert len(decoded.frames) == 9 and decoded.fps == 24 and decoded.frames[0].size == (64, 64)


def test_nothing_but_the_boxes_is_read_before_the_gate(monkeypatch):
    """No demuxer and no decoder touch the bytes at the door: PyAV's open is only called once decoding."""

    def refused(*args, **kwargs):
        raise AssertionError("PyAV opened the file before the gate")

    monkeypatch.setattr(av, "open", refused)
    assert read(MP4).frames == 9


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (png_bytes(example_image()), "is not a video"),
        (b"not a video at all", "is not a video"),
        (b"", "is not a video"),
    ],
    ids=["png", "text", "empty"],
)
def test_a_file_that_is_no_mp4_is_refused_as_not_a_video(data, rule):
    with pytest.raises(InvalidRequestError, match=rf"parameters\.video {rule}.*accepted: an MP4 video"):
        read(data)


@pytest.mark.parametrize("kept", [0.25, 0.5, 0.9, 0.999])
def test_a_truncated_mp4_is_refused_by_name(kept):
    with pytest.raises(InvalidRequestError, match=r"parameters\.video is a truncated MP4.*accepted: an MP4 video"):
        read(MP4[: int(len(MP4) * kept)])


def test_an_mp4_without_its_moov_is_truncated():
    head = struct.unpack_from(">I", MP4, 0)[0]  # the ftyp box alone
    with pytest.raises(InvalidRequestError, match=r"truncated MP4 \(no moov box"):
        read(MP4[:head])


def test_a_container_of_endless_boxes_is_refused_after_a_bounded_walk():
    """A zip bomb's shape: a valid ftyp, then 100,000 empty boxes; refused after 4096, nothing else read."""
    with pytest.raises(InvalidRequestError, match="more than 4096 boxes"):
        read(endless_boxes(MP4))


def test_a_video_in_a_codec_not_read_here_is_refused_naming_it_and_the_accepted_ones():
    """The sample entry's fourcc against `CODECS`: MPEG-4 Part 2 (`mp4v`) is refused from the header alone, naming
    it and the codecs taken; each accepted one is read under its own name."""
    assert with_codec(MP4, b"mp4v") != MP4 and read(MP4).codec == "H.264"
    refusal = r"parameters\.video is a video in 'mp4v', a codec not read here; accepted: an MP4 video \(H\.264, HEVC"
    with pytest.raises(InvalidRequestError, match=refusal):
        read(with_codec(MP4, b"mp4v"))
    for fourcc, name in CODECS.items():
        assert read(with_codec(MP4, fourcc)).codec == name


def test_too_many_frames_too_long_and_too_many_pixels_are_refused_by_their_rule():
    with pytest.raises(LimitExceededError, match=r"parameters\.video is too long: 9 frames.*at most 8 frames"):
        read(MP4, frames=8)
    with pytest.raises(LimitExceededError, match=r"has too many pixels: 64x64 \(4,096\).*at most 4,000 pixels"):
        read(MP4, pixels=4000)
    with pytest.raises(LimitExceededError, match=r"is too long: 0.38 s.*at most 0.25 s"):
        check_video_size(read(MP4), max_pixels=10**6, max_frames=81, max_seconds=0.25)
