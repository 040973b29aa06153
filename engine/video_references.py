"""A request's reference video (`GenerateRequest.reference_video`: an IC-LoRA's) checked for
`engine.normalise.normalise_request` (the one gate), before it is decoded.

Policy: only a pool whose family has an in-context pipeline (`ModelDefaults.reference_video`: LTX-2's
`LTX2InContextPipeline`) takes one; elsewhere it is refused, naming what is accepted. An image may come with it:
the video's first frame, as in image-to-video (the in-context call's frame-0 condition; never a mask: a video is
not inpainted, which `engine.video_checks` refuses first). Its header's facts
(`engine.video_input.EncodedVideo`: read at the door, nothing decoded) are held to MAX_VIDEO_FRAMES, to the pool's
longest clip (`max_seconds`) and a frame's pixels to MAX_INPUT_PIXELS; only then is it decoded (at most the
header's frames). A video made in code (`InputVideo`, a request checked before) is held to the same limits.
"""

from __future__ import annotations

from engine.errors import InvalidRequestError, LimitExceededError
from engine.requests import GenerateRequest, Limits, ModelDefaults
from engine.video_input import ACCEPTED_VIDEO, EncodedVideo, InputVideo, check_video_size, decode_video

__all__ = ["checked_reference_video"]


def checked_reference_video(request: GenerateRequest, defaults: ModelDefaults, limits: Limits) -> InputVideo | None:
    """The request's reference video, checked as the module docstring says, then decoded (None: none sent)."""
    video = request.reference_video
    if video is None:
        return None
    if not isinstance(video, EncodedVideo | InputVideo):
        raise InvalidRequestError(f"video is a {type(video).__name__}; accepted: {ACCEPTED_VIDEO} (or none)")
    if not defaults.reference_video:
        named = f" ({defaults.base_model})" if defaults.base_model else ""
        raise InvalidRequestError(
            f"video (an IC-LoRA's reference video) was given, but this pool{named} has no in-context pipeline; "
            "accepted: a reference video only on an LTX-2 pool, with its IC-LoRA (here: no video)"
        )
    if isinstance(video, EncodedVideo):
        check_video_size(
            video,
            max_pixels=limits.max_input_pixels,
            max_frames=limits.max_video_frames,
            max_seconds=defaults.max_seconds,
        )
        return decode_video(video)
    first = video.frames[0] if video.frames else None
    if first is None or len(video.frames) > limits.max_video_frames or first.pixels > limits.max_input_pixels:
        raise LimitExceededError(
            f"video has {len(video.frames)} frames of {first.size if first else 'no size'}; accepted: "
            f"{ACCEPTED_VIDEO}, of 1 to {limits.max_video_frames} frames of at most {limits.max_input_pixels:,} "
            "pixels each"
        )
    return video
