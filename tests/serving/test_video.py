"""Video answers' files (`serving.video`): MP4s decode (with PyAV, the library that wrote them) to the frames made
here within the codec's tolerance, with their frame count, frame rate and recipe; animated WebP and GIF too.

The tolerance: a mean absolute difference of at most 4 levels per channel on every frame. The 2-level rule of
the image tests holds between pipelines' lossless outputs; an H.264 4:2:0 file halves the chroma's resolution,
converts RGB to limited-range YUV and back (rounding each way) and quantizes at CRF 18, which moves smooth
frames about 2 levels on average (single pixels up to about 10). Each decoded frame is also nearer its own
frame than any other, so order and count are checked, not only closeness.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from serving.recipes import parse_recipe
from serving.video import MP4, decode_mp4, encode_video, even_sides, video_media_type
from tests.support.video import TOLERANCE, frames, mean_difference

RECIPE = 'a fox running <lora:owner/wan-style:0.8>\nSteps: 4, Seed: 7, Size: 64x48, Model: "tiny, wan", Version: x'


def test_an_mp4_decodes_to_its_frames_with_their_count_fps_and_recipe():
    made = frames()
    data = encode_video(made, 16, MP4, RECIPE)
    assert data[4:8] == b"ftyp"
    decoded = decode_mp4(data)
    assert len(decoded.frames) == len(made)
    assert decoded.fps == 16
    assert decoded.comment == RECIPE
    assert parse_recipe(decoded.comment).request.seed == 7
    for index, frame in enumerate(decoded.frames):
        assert frame.size == made[index].size
        differences = [mean_difference(frame, source) for source in made]
        assert differences[index] <= TOLERANCE, (index, differences[index])
        assert differences[index] == min(differences), (index, differences)


def test_the_same_frames_give_the_same_bytes():
    made = frames(5)
    assert encode_video(made, 24, MP4, RECIPE) == encode_video(made, 24, MP4, RECIPE)


def test_the_stream_is_h264_in_yuv420p():
    import av

    with av.open(io.BytesIO(encode_video(frames(3), 16)), mode="r") as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert container.metadata.get("comment") is None


def test_odd_sides_repeat_the_last_column_and_row():
    made = frames(3, width=33, height=21)
    decoded = decode_mp4(encode_video(made, 8))
    assert decoded.frames[0].size == (34, 22)
    padded = even_sides(made[0])
    assert padded.size == (34, 22)
    pixels = np.asarray(padded)
    assert (pixels[:, 33] == pixels[:, 32]).all() and (pixels[21] == pixels[20]).all()
    assert (pixels[:21, :33] == np.asarray(made[0])).all()
    assert mean_difference(decoded.frames[1], even_sides(made[1])) <= TOLERANCE


def test_an_animated_webp_has_every_frame_its_timing_and_recipe():
    made = frames(6)
    image = Image.open(io.BytesIO(encode_video(made, 10, "image/webp", RECIPE)))
    assert image.format == "WEBP" and image.n_frames == 6
    comment = image.getexif().get_ifd(0x8769)[0x9286]
    assert comment == b"UNICODE\x00" + RECIPE.encode("utf-16-be")
    for index in range(6):
        image.seek(index)
        image.load()  # PIL reads a WebP frame's timing as it decodes it
        assert image.info["duration"] == 100
        assert mean_difference(image.convert("RGB"), made[index]) <= TOLERANCE


def test_an_animated_gif_has_every_frame_its_timing_and_recipe():
    made = frames(4)
    image = Image.open(io.BytesIO(encode_video(made, 16, "image/gif", RECIPE)))
    assert image.format == "GIF" and image.n_frames == 4
    assert image.info["comment"] == RECIPE.encode("utf-8")
    # GIF counts hundredths of a second: 1/16 s is written as 60 ms.
    assert image.info["duration"] == 60


def _gif_frames(data: bytes) -> list[tuple[int, Image.Image]]:
    """Each frame of a GIF as PIL reads it: its time (milliseconds) and its pixels."""
    image = Image.open(io.BytesIO(data))
    read = []
    for index in range(image.n_frames):
        image.seek(index)
        read.append((image.info["duration"], image.convert("RGB")))
    return read


@pytest.mark.parametrize(("fps", "count"), [(16, 81), (24, 49), (30, 31), (50, 26), (60, 61)])
def test_a_gifs_frame_times_are_whole_hundredths_of_at_least_two_and_keep_the_clips_length(fps, count):
    """Browsers play a GIF frame of less than 2 hundredths at 10 a second: 60 fps written as 1.7 hundredths (PIL
    writes 1) played at 10 fps. Each frame's time is whole hundredths of at least 2 and together they are the
    clip's length; above 50 fps the GIF shows the frame playing every 2 hundredths, in order."""
    made = frames(count, 32, 24)
    read = _gif_frames(encode_video(made, fps, "image/gif"))
    times = [time for time, _ in read]
    assert all(time % 10 == 0 and time >= 20 for time in times), times
    assert abs(sum(times) - count * 1000 / fps) <= 5
    # Which source frame each shown one is (the nearest of all, as GIF's palette allows): every frame in order up
    # to 50 fps; above, the one playing as its 2 hundredths start.
    start, shown = 0, []
    for time, image in read:
        shown.append(min(range(count), key=lambda index: mean_difference(image, made[index])))
        assert fps <= 50 or shown[-1] == int(start * fps / 1000), (start, shown[-1])
        start += time
    assert shown == list(range(count)) if fps <= 50 else len(shown) == round(count * 100 / fps) // 2


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, "video/mp4"),
        ("*/*", "video/mp4"),
        ("image/png", "video/mp4"),
        ("image/webp", "image/webp"),
        ("image/gif, image/webp;q=0.5", "image/gif"),
        ("video/mp4;q=0.4, image/webp;q=0.9", "image/webp"),
        ("image/webp, video/mp4", "video/mp4"),
        ("image/gif;q=0", "video/mp4"),
    ],
)
def test_the_accept_header_picks_the_video_type(accept, expected):
    assert video_media_type(accept) == expected


def test_refusals_name_the_bad_value():
    with pytest.raises(ValueError, match="at least one frame"):
        encode_video([], 16)
    with pytest.raises(ValueError, match="fps must be above 0"):
        encode_video(frames(2), 0)
    with pytest.raises(ValueError, match="image/png"):
        encode_video(frames(2), 16, "image/png")
