"""The request a client sends (`GenerateRequest`), each field declared once on it (`engine.request_schema`), and
its fixed ranges; `REQUEST_FIELDS` (in order) and `DECLARED_FIELDS` (by name) are those declarations, the one
source every door's schema, the UI's controls and the checks read them from. `engine.requests` re-exports these
beside the checked request, the pool's defaults and the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from types import MappingProxyType
from typing import Literal

from engine.images import RequestImage
from engine.limits import MAX_IMAGES
from engine.lora_spec import LoraSpec
from engine.request_schema import FieldKind, RequestField, request_field
from engine.result_parts import MAX_SEED
from engine.video_input import ACCEPTED_VIDEO, RequestVideo
from lora_catalog import refs

__all__ = [
    "DECLARED_FIELDS",
    "FPS_RANGE",
    "GUIDANCE_RANGE",
    "LOCAL_PREFIX",
    "MIN_SIDE",
    "REQUEST_FIELDS",
    "SCALE_RANGE",
    "GenerateRequest",
    "RequestMode",
    "fields_of",
]

SCALE_RANGE = (-2.0, 2.0)
# A video's frames per second: what players show well (the encoder writes any rate; Wan makes 16 or 24).
FPS_RANGE = (4, 60)
GUIDANCE_RANGE = (0.0, 30.0)
MIN_SIDE = 64
LOCAL_PREFIX = refs.LOCAL_PREFIX


_INTEGER, _NUMBER, _TEXT = "an integer", "a number", "a string"
_SAMPLER = "a string: a sampler name such as 'DPM++ 2M Karras' or a diffusers scheduler class"
_OPTIONS = 'an object of scheduler options, e.g. {"use_karras_sigmas": true, "timestep_spacing": "trailing"}'
_IMAGE = "a PNG, JPEG or WebP image"
_IMAGES = "a list of PNG, JPEG or WebP images"
_STRENGTH = "a number from 0 to 1"
_FRAMES = "an integer of the form 4k+1 (5, 9, ..., 81)"
_IC = "an IC-LoRA's reference video"
_IC_STRENGTH = "how strongly the video and its reference video attend to each other (IC-LoRA; 1: fully)"
_IC_DOWN = (
    "the reference video's downscale (IC-LoRA: the factor its LoRA was trained with; unset: its file's, else 1; "
    "1: the video's size)"
)
_LOW_CFG, _KINDS = "low-noise stage guidance scale (Wan 2.2 A14B)", "image, video or none"
_DOWNSCALE = "an integer from 1 to 8"
_F = RequestField


def _in_context(name: str, kind: FieldKind, accepts: str, description: str, high: int) -> RequestField:
    """An in-context call's setting (0 or 1 to `high`): `name` on POST / and the video endpoint's last argument."""
    low = 1 if kind == "integer" else 0
    return _F(kind, accepts, description, low, high, http=name, video=True, gradio_video_last=(name,))


# Which of a pool's pipelines a request runs on (`GenerateRequest.mode`).
RequestMode = Literal["text-to-image", "image-to-image", "inpainting"]


@dataclass(frozen=True)
class GenerateRequest:
    """A request as a client asked for it: numbers as sent (2.5 steps is refused by name, not rounded).

    Each field declares itself once (`engine.request_schema`); every transport's model is derived from these.
    """

    prompt: str = request_field(MISSING, _F("text", _TEXT, "what to draw", gradio=("prompt",)))
    negative_prompt: str = request_field(
        "", _F("text", _TEXT, "what to keep out (CFG models)", http="negative_prompt", gradio=("negative_prompt",))
    )
    loras: tuple[LoraSpec, ...] = request_field(
        (),
        _F(
            "loras",
            "a list of LoRAs",
            "the LoRAs and their scales",
            http="loras",
            gradio=("lora", "lora_scale", "lora_2", "lora_2_scale"),
            gradio_video=("lora_scale_2", "lora_2_scale_2"),
            gradio_late=("lora_start", "lora_end", "lora_2_start", "lora_2_end"),
        ),
    )
    steps: float | None = request_field(
        None, _F("integer", _INTEGER, "denoising steps", low=1, http="num_inference_steps", gradio=("steps",))
    )
    guidance: float | None = request_field(
        None,
        _F("number", _NUMBER, "guidance scale", *GUIDANCE_RANGE, http="guidance_scale", gradio=("guidance",)),
    )
    width: float | None = request_field(
        None, _F("integer", _INTEGER, "image width in px", low=MIN_SIDE, http="width", gradio=("width",))
    )
    height: float | None = request_field(
        None, _F("integer", _INTEGER, "image height in px", low=MIN_SIDE, http="height", gradio=("height",))
    )
    seed: float | None = request_field(
        None, _F("integer", _INTEGER, "the first image's seed", 0, MAX_SEED, http="seed", gradio=("seed",))
    )
    # A sampler by the name people know ("DPM++ 2M Karras": engine.samplers) or a diffusers scheduler class the
    # pool accepts (`ModelDefaults.schedulers`); None: the pool's own scheduler.
    scheduler: str | None = request_field(
        None, _F("sampler", _SAMPLER, "the sampler", http="scheduler", gradio=("scheduler",))
    )
    # (option, value) pairs set on that scheduler (`engine.samplers.OPTION_VALUES`), where its class has them.
    scheduler_options: tuple[tuple[str, object], ...] = request_field(
        (), _F("options", _OPTIONS, "the sampler's options", http="scheduler_options", gradio=("scheduler_options",))
    )
    # Text-encoder layers skipped, as diffusers' `pipe(..., clip_skip=N)` counts them (A1111's "Clip skip 2" is 1).
    clip_skip: float | None = request_field(
        None, _F("integer", _INTEGER, "text-encoder layers skipped", low=0, http="clip_skip", gradio=("clip_skip",))
    )
    # Images with consecutive seeds from `seed` (1 to MAX_IMAGES).
    num_images: float | None = request_field(
        None, _F("integer", _INTEGER, "images from consecutive seeds", 1, MAX_IMAGES, gradio=("num_images",))
    )
    # Whether the LoRAs' recommended settings (a speed LoRA's, a card's) fill what the client left unset; the
    # UI's switch. Off: the pool's defaults.
    lora_defaults: bool = request_field(True, _F("switch", "true or false", "the LoRAs' recommended settings"))
    # The image to start from (`engine.images`: a door's file, or pixels): with it the request is image-to-image
    # (or an editing pool's instruction); the output is its size rounded to the pool's side multiple, or `width` x
    # `height` when set (the image resized to that first, unless the pool reads it as a reference). None: text only.
    image: RequestImage | None = request_field(None, _F("image", _IMAGE, "the image to start from", gradio=("image",)))
    # An inpainting mask (in `L`): white is repainted, black kept; resized to the image's size (with a warning) when
    # it differs. Needs `image`.
    mask_image: RequestImage | None = request_field(
        None, _F("image", _IMAGE, "the inpainting mask (white repainted)", http="mask_image", gradio=("mask",))
    )
    # How much of the image is re-noised (0: kept, 1: all); runs int(steps * strength) steps, as diffusers does.
    # None: the pool's default for the mode (`ModelDefaults.strength`, `.inpaint_strength`).
    strength: float | None = request_field(
        None, _F("number", _STRENGTH, "how much of the image is re-noised", 0, 1, http="strength", gradio=("strength",))
    )
    # Further reference images after `image` (the prompt's "image 2", "image 3", ...), in that order, for a pool
    # whose own pipeline takes a list of references (`ModelDefaults.max_reference_images`); needs `image`.
    # Last, so that the Gradio API's positional arguments before it keep their places.
    images: tuple[RequestImage, ...] = request_field(
        (), _F("images", _IMAGES, "further reference images (image 2, 3, ...)", http="images", gradio=("images",))
    )
    # A video pool's (`ModelDefaults.video`) frames: 4k+1 (Wan's VAE makes 4 frames of each latent frame after the
    # first), at most the pool's `max_frames` and MAX_VIDEO_FRAMES; None: the pool's default. The video fields come
    # after `images` (the Gradio API's positional arguments keep their places) and are refused on an image pool.
    num_frames: float | None = request_field(
        None, _F("integer", _FRAMES, "video frames", low=1, http="num_frames", gradio=("num_frames",), video=True)
    )
    # The video's frames per second (the encoder's rate; the model makes the same frames whatever it is); None:
    # the pool's default (Wan 2.1's 16, Wan 2.2 TI2V-5B's 24).
    fps: float | None = request_field(
        None, _F("integer", _INTEGER, "video frames per second", *FPS_RANGE, http="fps", gradio=("fps",), video=True)
    )
    # The low-noise stage's guidance on a two-stage pool (Wan 2.2 A14B's `guidance_scale_2`); None: the pool's
    # default. `guidance` is the high-noise stage's. Ignored with a warning on a video pool of one stage.
    guidance_2: float | None = request_field(
        None,
        _F("number", _NUMBER, _LOW_CFG, *GUIDANCE_RANGE, http="guidance_scale_2", gradio=("guidance_2",), video=True),
    )
    # What the door answers (`engine.video_checks.kind_refusal`): "image" from the image endpoints (/generate,
    # /generate_images, a comparison), "video" from /generate_video; None (POST /, the UI): what the pool makes.
    expects: str | None = request_field(None, _F("text", _KINDS, "what the door answers (set by the door)"))
    # An IC-LoRA's reference video (`engine.video_input`: read to its header at a door, decoded once checked), on a
    # pool with an in-context pipeline (`ModelDefaults.reference_video`). Last: no earlier positional argument moves.
    reference_video: RequestVideo | None = request_field(
        None, _F("video", ACCEPTED_VIDEO, _IC, http="video", video=True, gradio_video_last=("video",))
    )
    # The in-context call's own settings (diffusers' `conditioning_attention_strength`, `reference_downscale_factor`),
    # only with `reference_video`; None: diffusers' defaults (1.0, 1), but an unset downscale is the IC-LoRA's own
    # where its file says (`engine.video_references.trained_downscale`). After it: no earlier positional argument
    # moves.
    reference_strength: float | None = request_field(
        None, _in_context("reference_strength", "number", _STRENGTH, _IC_STRENGTH, 1)
    )
    reference_downscale: float | None = request_field(
        None, _in_context("reference_downscale", "integer", _DOWNSCALE, _IC_DOWN, 8)
    )

    @property
    def mode(self) -> RequestMode:
        """What the request asks for: text-to-image, image-to-image, or inpainting (an image and a mask)."""
        if self.image is None:
            return "text-to-image"
        return "image-to-image" if self.mask_image is None else "inpainting"


def fields_of(cls: type[GenerateRequest] = GenerateRequest) -> tuple[RequestField, ...]:
    """The request's fields as declared, in order, each with its name."""
    return tuple(replace(f.metadata["request"], name=f.name) for f in fields(cls) if "request" in f.metadata)


REQUEST_FIELDS = fields_of()
# Each declaration by its field's name: the one map (a door's schema, a UI control, a check reads its field here).
DECLARED_FIELDS: Mapping[str, RequestField] = MappingProxyType({f.name: f for f in REQUEST_FIELDS})
