"""Requests and results: frozen and typed. The request a client sends and its fields' declarations live in
`engine.request_fields` (each declared once, `engine.request_schema`), re-exported here; here are the checked
request, the served model's defaults and a run's result.

`engine.normalise.normalise_request` is the single gate every entry point (UI, Gradio API, HTTP) goes through:
it checks types and ranges, fills the served model's defaults and returns a new request, the caller's unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.images import InputImage
from engine.limits import MAX_IMAGES, Limits
from engine.lora_spec import LoraSpec
from engine.references import ReferenceFit
from engine.request_fields import (
    DECLARED_FIELDS,
    FPS_RANGE,
    GUIDANCE_RANGE,
    LOCAL_PREFIX,
    MIN_SIDE,
    REQUEST_FIELDS,
    SCALE_RANGE,
    GenerateRequest,
    RequestMode,
    fields_of,
)
from engine.request_schema import request_field
from engine.result_parts import MAX_SEED, AdapterUse, Soundtrack, Suggested, Timings, seeds_of
from engine.samplers import SchedulerOptions, menu, sampler_label
from engine.video_input import InputVideo

if TYPE_CHECKING:
    from PIL.Image import Image


__all__ = [
    "DECLARED_FIELDS",
    "FPS_RANGE",
    "GUIDANCE_RANGE",
    "LOCAL_PREFIX",
    "MAX_IMAGES",
    "MAX_SEED",
    "MIN_SIDE",
    "REQUEST_FIELDS",
    "SCALE_RANGE",
    "SUGGESTIBLE",
    "TINY_MAX_SIDE",
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

# How a served model reads `guidance`: classifier-free guidance (with the negative prompt), a distilled guidance
# embedding (FLUX.1 [dev]: no negative prompt, one pass per step), or not at all (FLUX.1 [schnell]).
GuidanceKind = Literal["cfg", "distilled", "none"]


@dataclass(frozen=True)
class CheckedRequest(GenerateRequest):
    """A request `normalise_request` has checked: whole numbers in range, defaults filled, a concrete seed.

    `scheduler` is a class name the pool accepts, or None for the pool's own; `sampler` names what runs either
    way (the recipe's `Sampler:`). `defaults_from` says where each default that is not the pool's came from.
    """

    # Its images are pixels: the check decoded each file once it was counted and weighed (the same declarations).
    image: InputImage | None = request_field(None, DECLARED_FIELDS["image"])
    mask_image: InputImage | None = request_field(None, DECLARED_FIELDS["mask_image"])
    images: tuple[InputImage, ...] = request_field((), DECLARED_FIELDS["images"])
    reference_video: InputVideo | None = request_field(None, DECLARED_FIELDS["reference_video"])
    reference_downscale: int | None = request_field(None, DECLARED_FIELDS["reference_downscale"])

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
