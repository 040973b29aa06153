"""Requests and results: frozen and typed; each request field declared once (`engine.request_schema`).

`engine.normalise.normalise_request` is the single gate every entry point (UI, Gradio API, HTTP) goes through:
it checks types and ranges, fills the served model's defaults and returns a new request, the caller's unchanged.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Literal

from engine.images import InputImage, RequestImage
from engine.limits import MAX_IMAGES, Limits
from engine.lora_spec import LoraSpec
from engine.references import ReferenceFit
from engine.request_schema import FieldKind, RequestField, request_field
from engine.result_parts import MAX_SEED, AdapterUse, Soundtrack, Suggested, Timings, seeds_of
from engine.samplers import SchedulerOptions, menu, sampler_label
from engine.video_input import ACCEPTED_VIDEO, InputVideo, RequestVideo
from lora_catalog import refs

if TYPE_CHECKING:
    from PIL.Image import Image


__all__ = [
    "FPS_RANGE",
    "MAX_IMAGES",
    "MAX_SEED",
    "REQUEST_FIELDS",
    "SUGGESTIBLE",
    "AdapterUse",
    "CheckedRequest",
    "GenerateRequest",
    "GenerateResult",
    "GuidanceKind",
    "InputImage",
    "Limits",
    "LoraSpec",
    "ModelDefaults",
    "RequestMode",
    "Soundtrack",
    "Suggested",
    "Timings",
    "fields_of",
    "seeds_of",
]

SCALE_RANGE = (-2.0, 2.0)
# A video's frames per second: what players show well (the encoder writes any rate; Wan makes 16 or 24).
FPS_RANGE = (4, 60)
GUIDANCE_RANGE = (0.0, 30.0)
MIN_SIDE = 64
LOCAL_PREFIX = refs.LOCAL_PREFIX
# How a served model reads `guidance`: classifier-free guidance (with the negative prompt), a distilled guidance
# embedding (FLUX.1 [dev]: no negative prompt, one pass per step), or not at all (FLUX.1 [schnell]).
GuidanceKind = Literal["cfg", "distilled", "none"]


_INTEGER, _NUMBER, _TEXT = "an integer", "a number", "a string"
_SAMPLER = "a string: a sampler name such as 'DPM++ 2M Karras' or a diffusers scheduler class"
_OPTIONS = 'an object of scheduler options, e.g. {"use_karras_sigmas": true, "timestep_spacing": "trailing"}'
_IMAGE = "a PNG, JPEG or WebP image"
_IMAGES = "a list of PNG, JPEG or WebP images"
_STRENGTH = "a number from 0 to 1"
_FRAMES = "an integer of the form 4k+1 (5, 9, ..., 81)"
_IC = "an IC-LoRA's reference video"
_IC_STRENGTH = "how strongly the video and its reference video attend to each other (IC-LoRA; 1: fully)"
_IC_DOWN = "the reference video's downscale (IC-LoRA: the factor its LoRA was trained with; 1: the video's size)"
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
    # only with `reference_video`; None: diffusers' defaults (1.0, 1). After it: no earlier positional argument moves.
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
_DECLARED = {f.name: f.metadata for f in fields(GenerateRequest)}


@dataclass(frozen=True)
class CheckedRequest(GenerateRequest):
    """A request `normalise_request` has checked: whole numbers in range, defaults filled, a concrete seed.

    `scheduler` is a class name the pool accepts, or None for the pool's own; `sampler` names what runs either
    way (the recipe's `Sampler:`). `defaults_from` says where each default that is not the pool's came from.
    """

    # Its images are pixels: the check decoded each file once it was counted and weighed (the same declarations).
    image: InputImage | None = field(default=None, metadata=_DECLARED["image"])
    mask_image: InputImage | None = field(default=None, metadata=_DECLARED["mask_image"])
    images: tuple[InputImage, ...] = field(default=(), metadata=_DECLARED["images"])
    reference_video: InputVideo | None = field(default=None, metadata=_DECLARED["reference_video"])
    reference_downscale: int | None = field(default=None, metadata=_DECLARED["reference_downscale"])

    steps: int = 0
    guidance: float = 0.0
    width: int = 0
    height: int = 0
    seed: int = 0
    scheduler_options: SchedulerOptions = ()
    clip_skip: int = 0
    num_images: int = 1
    # A video request's frames and rate (0 on an image pool) and its low-noise guidance (None: one stage).
    num_frames: int = 0
    fps: int = 0
    guidance_2: float | None = None
    sampler: str = ""
    defaults_from: tuple[tuple[str, str], ...] = ()
    # The fields the client left to the defaults (of `SUGGESTIBLE`): the LoRAs' recommendations may fill them
    # once they are prepared (`with_suggested`), without checking the request again.
    left_unset: tuple[str, ...] = ()
    # What the check changed or left out of what was sent (a mask resized to its image, a strength the model does
    # not take), said as the result's warnings (`ModelDefaults.ignored`).
    notes: tuple[str, ...] = ()

    @property
    def seeds(self) -> tuple[int, ...]:
        """Each image's seed: consecutive from `seed` (wrapping within the seed range)."""
        return seeds_of(self.seed, self.num_images)


# The fields a LoRA's recommendation may fill where the client left them unset (`Suggested`).
SUGGESTIBLE = ("steps", "guidance", "scheduler", "clip_skip", "guidance_2")


# The tiny pipelines make 64-128 px images; the smallest real base (SD 1.5) makes 512 px ones.
TINY_MAX_SIDE = 128


@dataclass(frozen=True)
class ModelDefaults:
    """The served model's request defaults, the (width, height) presets the UI offers (its family's), its
    scheduler class, the scheduler classes a request may name, the largest `clip_skip` (0: none taken), and which
    inputs it reads: how it reads `guidance` (`GuidanceKind`) and whether it reads the negative prompt.

    `modes`: the requests it serves (`GenerateRequest.mode`). `strength` and `inpaint_strength`: the default
    strength of its image-to-image and inpainting pipelines (diffusers' own defaults for those classes); None
    where it has no such pipeline or its pipeline takes no strength (FLUX.1 Kontext). `needs_image`: an
    instruction-editing pool, which takes no request without an image. `max_reference_images`: the images a
    request may bring in all (`image` and `images`): 0 on a text-to-image-only pool, 1 where one image is all its
    pipelines take, more where its own pipeline takes a list of references; `inpaint_references`: its inpainting
    pipeline takes them too (beside the image it repaints)."""

    steps: int
    guidance: float
    side: int
    max_side: int
    sizes: tuple[tuple[int, int], ...] = ()
    scheduler: str = ""
    schedulers: tuple[str, ...] = ()
    max_clip_skip: int = 0
    guidance_kind: GuidanceKind = "cfg"
    negative_prompt: bool = True
    side_multiple: int = 8
    strength: float | None = None
    inpaint_strength: float | None = None
    needs_image: bool = False
    modes: tuple[RequestMode, ...] = ("text-to-image",)
    max_reference_images: int = 0
    inpaint_references: bool = False
    # How its pipeline sizes each reference it reads (`engine.references`: the warnings saying so); None: as given.
    reference_fit: ReferenceFit | None = None
    # A video pool (Wan): its default frames and rate, its frame rule (`frame_multiple`k+1) and its most frames;
    # `guidance_2`: its low-noise stage's default guidance (None: one stage). Its `modes` read as text-to-video
    # ("text-to-image") and image-to-video ("image-to-image"); an image-to-video-only pool `needs_image`.
    video: bool = False
    num_frames: int = 0
    fps: int = 0
    frame_multiple: int = 4
    max_frames: int = 0
    guidance_2: float | None = None
    # The longest clip its model makes (frames / fps, seconds; 0: no bound).
    max_seconds: float = 0.0
    # The (frames, width, height) its memory plan is made for: more tokens are refused (`engine.video_checks`).
    video_plan: tuple[int, ...] = ()
    reference_video: bool = False  # an in-context pipeline (LTX-2's IC-LoRAs): `reference_video` is taken
    base_model: str = ""  # the served base's repo id, which refusals name ("" from a peer that does not say)

    def __post_init__(self) -> None:
        # JSON's presets (cluster, remote `info`) are lists: tuples here; none (older peer): the default side's square.
        sizes = tuple((int(w), int(h)) for w, h in self.sizes) or ((self.side, self.side),)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "schedulers", tuple(self.schedulers))
        object.__setattr__(self, "modes", tuple(self.modes))
        object.__setattr__(self, "video_plan", tuple(self.video_plan))

    @property
    def two_stage(self) -> bool:
        """Two transformers, high-noise then low-noise steps (Wan 2.2 A14B): LoRAs take a `scale_2` there."""
        return self.guidance_2 is not None

    @property
    def is_tiny(self) -> bool:
        """The one rule for "this is a tiny test model": its default image side (no real base is under 512)."""
        return self.side <= TINY_MAX_SIDE

    def ignored(self, request: CheckedRequest) -> tuple[str, ...]:
        """Warnings for what `request` sets that this model does not read (accepted, and left unused)."""
        warnings = []
        if request.negative_prompt and not self.negative_prompt:
            warnings.append(
                "negative_prompt does not apply to this model (its guidance is distilled into it: no CFG); ignored"
            )
        if self.guidance_kind == "none" and request.guidance != self.guidance:
            warnings.append(f"guidance does not apply to this model (it takes none); {request.guidance:g} ignored")
        if self.video and self.guidance_2 is None and request.guidance_2 is not None:
            warnings.append(
                f"guidance_2 does not apply to this model (it denoises in one stage: guidance is its guidance); "
                f"{request.guidance_2:g} ignored"
            )
        return (*warnings, *request.notes)

    @property
    def sampler(self) -> str:
        """The name of the pool's own scheduler ("Euler" for SDXL's)."""
        return sampler_label(self.scheduler, ()) if self.scheduler else ""

    @property
    def samplers(self) -> tuple[str, ...]:
        """The sampler names a request may use here (the UI's menu)."""
        return menu(self.schedulers)


@dataclass(frozen=True)
class GenerateResult:
    """What a run made: the first image and its seed, and for a request of several the rest (their seeds follow
    on: `seeds`). A video (a video pool's run): `frames` in order at `fps` (empty and 0 for images), `image` its
    first frame; `video` a cluster replica's MP4 (`serving.video.packed`), `frames` then empty (undecoded)."""

    image: Image
    seed: int
    request: CheckedRequest
    timings: Timings
    adapters: tuple[AdapterUse, ...] = ()
    swapped: bool = False
    warnings: tuple[str, ...] = ()
    more_images: tuple[Image, ...] = ()
    # The model that made it (its Hub id or folder name): a recipe's `Model:`.
    model_id: str = ""
    # The cluster replica that made it (Serve's replica id; `X-Replica`); empty in one process.
    served_by: str = ""
    frames: tuple[Image, ...] = ()
    fps: int = 0
    video: bytes = b""
    # A video's sound (a family with `FamilySpec.audio_rate`: LTX-2); None: a silent video or an image.
    audio: Soundtrack | None = None

    @property
    def is_video(self) -> bool:
        return bool(self.frames or self.video)

    @property
    def mode(self) -> str:
        """What it is: a video (`is_video`, never a family) text- or image-to-video, an image its request's mode."""
        if self.is_video:
            return "text-to-video" if self.request.image is None else "image-to-video"
        return self.request.mode

    @property
    def images(self) -> tuple[Image, ...]:
        return (self.image, *self.more_images)

    @property
    def seeds(self) -> tuple[int, ...]:
        return seeds_of(self.seed, len(self.images))
