"""A request's reference video (`GenerateRequest.reference_video`: an IC-LoRA's) checked for
`engine.normalise.normalise_request` (the one gate), before it is decoded.

Policy: only a pool whose family has an in-context pipeline (`ModelDefaults.reference_video`: LTX-2's
`LTX2InContextPipeline`) takes one; elsewhere it is refused, naming what is accepted. An image may come with it:
the video's first frame, as in image-to-video (the in-context call's frame-0 condition; never a mask: a video is
not inpainted, which `engine.video_checks` refuses first). Its header's facts
(`engine.video_input.EncodedVideo`: read at the door, nothing decoded) are held to MAX_VIDEO_FRAMES, to the pool's
longest clip (`max_seconds`) and a frame's pixels to MAX_INPUT_PIXELS; only then is it decoded (at most the
header's frames). A video made in code (`InputVideo`, a request checked before) is held to the same limits.

The in-context call's own settings come only with a reference video: `reference_strength` (diffusers'
`conditioning_attention_strength`, 0 to 1) and `reference_downscale` (its `reference_downscale_factor`, 1 to 8,
which must leave the reference's sides, the video's divided by it, in the pool's side multiple: the VAE encodes
them). None: diffusers' defaults, not passed.

An IC-LoRA keeps the factor it was trained with in its metadata (`reference_downscale_factor`, as diffusers'
`LTX2InContextPipeline` says; read with the file: `PreparedAdapter.trained_downscale`). A request that sets no
`reference_downscale` runs at its LoRAs' factor (`trained_downscale`, once they are prepared), checked as a set
one is; one that sets another runs as asked, with a warning naming the trained factor. A factor that is not a
whole number from 1 to 8 (the declared bounds), or two LoRAs that disagree on a request that sets none, are
refused (400) naming the files. It is what the LoRA needs, not a recommendation: `lora_defaults` off keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TypedDict

from engine.errors import InvalidRequestError, LimitExceededError
from engine.requests import DECLARED_FIELDS, CheckedRequest, GenerateRequest, Limits, ModelDefaults
from engine.values import checked_int, checked_number
from engine.video_input import ACCEPTED_VIDEO, EncodedVideo, InputVideo, check_video_size, decode_video

__all__ = [
    "TRAINED_DOWNSCALE_KEY",
    "CheckedReference",
    "checked_reference",
    "checked_reference_settings",
    "checked_reference_video",
    "trained_downscale",
]

# Where an IC-LoRA file keeps the factor it was trained with (its safetensors metadata; diffusers' name).
TRAINED_DOWNSCALE_KEY = "reference_downscale_factor"

# The declared bounds (`engine.requests`: 0 to 1, 1 to 8), which every door's schema states; read at import, so a
# declaration without them fails to import rather than check against a bound nobody declared.
_STRENGTH = DECLARED_FIELDS["reference_strength"].bounds()
_LEAST, _MOST = (int(bound) for bound in DECLARED_FIELDS["reference_downscale"].bounds())


class CheckedReference(TypedDict):
    """A checked request's reference video and its in-context settings (`CheckedRequest`'s fields)."""

    reference_video: InputVideo | None
    reference_strength: float | None
    reference_downscale: int | None


def checked_reference(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits, size: tuple[int, int]
) -> CheckedReference:
    """The reference video (checked, then decoded) and its settings (checked for the output's `size`)."""
    strength, downscale = checked_reference_settings(request, size, defaults.side_multiple)
    video = checked_reference_video(request, defaults, limits)
    return CheckedReference(reference_video=video, reference_strength=strength, reference_downscale=downscale)


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


def checked_reference_settings(
    request: GenerateRequest, size: tuple[int, int], side_multiple: int
) -> tuple[float | None, int | None]:
    """The request's `reference_strength` and `reference_downscale`, checked as the module docstring says (the
    output's checked `size`); None where not sent."""
    strength, downscale = request.reference_strength, request.reference_downscale
    if request.reference_video is None:
        for name, value in (("reference_strength", strength), ("reference_downscale", downscale)):
            if value is not None:
                raise InvalidRequestError(
                    f"{name}={value!r} was given without a reference video; accepted: {name} only with video "
                    "(an IC-LoRA's reference video)"
                )
        return None, None
    checked_strength = None if strength is None else checked_number("reference_strength", strength, 1.0, *_STRENGTH)
    factor = None if downscale is None else checked_int("reference_downscale", downscale, 1, _LEAST, _MOST)
    if factor is not None:
        _check_divides(
            factor, size, side_multiple, "", f"a factor that leaves both sides multiples of {side_multiple}, or 1"
        )
    return checked_strength, factor


def trained_downscale(
    checked: CheckedRequest, trained: Sequence[tuple[str, str | None]], side_multiple: int
) -> tuple[CheckedRequest, tuple[str, ...]]:
    """`checked` at its LoRAs' trained factor where it set none, and the warnings for a set one that differs, as
    the module docstring says. `trained`: each LoRA's label and its metadata's factor as written (None: none)."""
    if checked.reference_video is None:
        return checked, ()
    factors = {label: _trained_factor(label, raw) for label, raw in trained if raw is not None}
    asked = checked.reference_downscale
    if asked is not None:
        warnings = tuple(
            f"reference_downscale={asked} differs from the {factor} {label} was trained with (its metadata's "
            f"{TRAINED_DOWNSCALE_KEY}); ran at {asked} as asked"
            for label, factor in factors.items()
            if factor != asked
        )
        return checked, warnings
    if len(set(factors.values())) > 1:
        said = " and ".join(f"{label} says {factor}" for label, factor in factors.items())
        raise InvalidRequestError(
            f"the IC-LoRAs disagree on the reference downscale they were trained with ({TRAINED_DOWNSCALE_KEY} "
            f"in their metadata: {said}); accepted: IC-LoRAs trained at one factor, or reference_downscale set"
        )
    if not factors:
        return checked, ()
    (label, factor), *_ = factors.items()
    where = f"{label}'s metadata ({TRAINED_DOWNSCALE_KEY})"
    _check_divides(
        factor,
        (checked.width, checked.height),
        side_multiple,
        f" (from {where})",
        f"a size whose sides are multiples of {factor * side_multiple}, or reference_downscale set",
    )
    came = (*checked.defaults_from, ("reference_downscale", where))
    return replace(checked, reference_downscale=factor, defaults_from=came), ()


def _trained_factor(label: str, raw: str) -> int:
    """A file's trained factor: a whole number (int's own forms, e.g. "2") within the declared bounds, so that the
    recipe that records it is a request every door takes again."""
    try:
        factor = int(raw)
    except ValueError:
        factor = 0
    if not _LEAST <= factor <= _MOST:
        raise InvalidRequestError(
            f"{label} has {TRAINED_DOWNSCALE_KEY}={raw!r} in its metadata, which is not a whole number from "
            f"{_LEAST} to {_MOST}; accepted: an IC-LoRA whose {TRAINED_DOWNSCALE_KEY} is the whole factor it was "
            "trained with, or none"
        )
    return factor


def _check_divides(factor: int, size: tuple[int, int], side_multiple: int, where: str, accepted: str) -> None:
    """The reference's sides (the video's divided by `factor`) in the pool's side multiple: the VAE encodes them."""
    if any(side % (factor * side_multiple) for side in size):
        width, height = size
        raise InvalidRequestError(
            f"reference_downscale={factor}{where} does not divide the video's {width}x{height} into sides in "
            f"multiples of {side_multiple} (the reference is encoded at {width // factor}x{height // factor}); "
            f"accepted: {accepted}"
        )
