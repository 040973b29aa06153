"""The cluster's wire size of a video answer, before and after it crossed as its MP4 (docs/cluster.md, "Video
answers"): 81 frames of 832x480 (MAX_VIDEO_FRAMES at Wan's 480p), noisy (the worst case for both PNG and H.264)
and smooth. A size, not a timing: `python -m bench.video_wire`."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
from PIL import Image

from engine.requests import GenerateRequest
from serving.cluster.answers import answer_to_json
from serving.cluster.wire import encode_png
from serving.video import packed
from tests.support.video import frames, video_result

COUNT, WIDTH, HEIGHT = 81, 832, 480


def _noisy(seed: int = 0) -> tuple[Image.Image, ...]:
    """Smooth frames with Gaussian noise (sigma 12 levels), as an undenoised Wan frame has grain."""
    rng = np.random.default_rng(seed)
    made = []
    for frame in frames(COUNT, WIDTH, HEIGHT):
        pixels = np.asarray(frame, np.float32) + rng.normal(0, 12, (HEIGHT, WIDTH, 3))
        made.append(Image.fromarray(pixels.clip(0, 255).round().astype(np.uint8)))
    return tuple(made)


def sizes(shown: tuple[Image.Image, ...]) -> dict[str, int]:
    """Bytes: the frames raw; Ray's pickle of the result before (frames) and after (`packed`); the HTTP wire's
    JSON before (the first image and every frame as base64 PNG) and after (`answer_to_json`); the MP4 alone."""
    made = video_result(GenerateRequest(prompt="a fox", num_frames=COUNT, fps=16, seed=1))
    result = dataclasses.replace(made, image=shown[0], frames=shown)
    sent = packed(result, recipes=True)
    before = len(json.dumps({"image": encode_png(shown[0]), "frames": [encode_png(f) for f in shown]}))
    return {
        "raw": sum(len(f.tobytes()) for f in shown),
        "ray_before": len(pickle.dumps(result)),
        "ray_after": len(pickle.dumps(sent)),
        "wire_before": before,
        "wire_after": len(json.dumps(answer_to_json(sent))),
        "mp4": len(sent.video),
    }


def main() -> None:
    for name, shown in (("noisy", _noisy()), ("smooth", tuple(frames(COUNT, WIDTH, HEIGHT)))):
        print(name, {key: f"{value / 1e6:.1f} MB" for key, value in sizes(shown).items()})


if __name__ == "__main__":
    main()
