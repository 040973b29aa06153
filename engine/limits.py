"""The limits a request is checked against (`engine.normalise.normalise_request`), from the settings: one frozen
value an engine and a cluster front end each hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.images import DEFAULT_MAX_INPUT_PIXELS, DEFAULT_MAX_REQUEST_PIXELS

if TYPE_CHECKING:
    from engine.settings import Settings

__all__ = ["MAX_IMAGES", "Limits"]

# Images one request may ask for (consecutive seeds, one denoising batch where memory allows).
MAX_IMAGES = 4


@dataclass(frozen=True)
class Limits:
    max_loras: int
    max_steps: int
    max_prompt_chars: int
    max_images: int = MAX_IMAGES
    max_input_pixels: int = DEFAULT_MAX_INPUT_PIXELS
    # All of a request's images' pixels, from their headers (MAX_REQUEST_PIXELS): what decoding them all costs.
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
    # Images one request may bring in all (`image` and `images`; MAX_REFERENCE_IMAGES); None: its pool's limit.
    max_reference_images: int | None = None
    # A video's most frames (MAX_VIDEO_FRAMES); a pool's own `max_frames` may be lower.
    max_video_frames: int = 81
    # The segments of one LoRA's schedule (MAX_SCHEDULE_SEGMENTS: `engine.schedules`).
    max_schedule_segments: int = 8

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        """The limits a request is checked against under `settings` (an engine's, a cluster front end's)."""
        return cls(
            settings.max_loras,
            settings.max_steps,
            settings.max_prompt_chars,
            max_input_pixels=settings.max_input_pixels,
            max_request_pixels=settings.max_request_pixels,
            max_reference_images=settings.max_reference_images,
            max_video_frames=settings.max_video_frames,
            max_schedule_segments=settings.max_schedule_segments,
        )
