"""Reference videos (an IC-LoRA's) as a client sends them: MP4s written by PyAV (`serving.video.encode_video`)."""

from __future__ import annotations

import struct

import numpy as np
from PIL import Image

from serving.video import encode_video


def reference_mp4(frames: int = 9, side: int = 64, fps: int = 24) -> bytes:
    """A moving gradient of `frames` frames `side` px square: its frames differ, so that it shows in a result."""
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    images = [
        Image.fromarray(np.stack([np.roll(ramp, 4 * i)[None, :].repeat(side, 0)] * 3, -1).astype(np.uint8))
        for i in range(frames)
    ]
    return encode_video(images, fps)


def endless_boxes(mp4: bytes, boxes: int = 100_000) -> bytes:
    """A zip bomb's shape: `mp4`'s valid ftyp box, then `boxes` empty `free` boxes (8 bytes each), no moov."""
    head = struct.unpack_from(">I", mp4, 0)[0]
    return mp4[:head] + struct.pack(">I4s", 8, b"free") * boxes


def with_codec(mp4: bytes, fourcc: bytes) -> bytes:
    """`mp4` whose video sample entry (the first in its `stsd` box) names `fourcc` in place of its codec's."""
    at = mp4.index(b"stsd") + 4 + 12  # past the box's kind, its version and flags, its entry count, the entry's size
    return mp4[:at] + fourcc + mp4[at + 4 :]
