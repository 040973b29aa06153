"""Reference videos (an IC-LoRA's) as a client sends them: MP4s written by PyAV (`serving.video.encode_video`)."""

from __future__ import annotations

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
