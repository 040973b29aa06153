"""Requests and results: frozen, typed, and validated in one place.

`normalise_request` is the single gate every entry point (UI, Gradio API, HTTP)
goes through: it checks types and ranges, fills the served model's defaults and
returns a new request; the caller's object is never changed.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from engine.errors import InvalidRequestError, LimitExceededError
from engine.request_schema import RequestField, request_field
from engine.samplers import SchedulerOptions, choose_scheduler, menu, sampler_label
from lora_catalog import refs
from lora_catalog.civitai.refs import ACCEPTED as CIVITAI_ACCEPTED
from lora_catalog.civitai.refs import parse_civitai

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "MAX_IMAGES",
    "REQUEST_FIELDS",
    "AdapterUse",
    "CheckedRequest",
    "GenerateRequest",
    "GenerateResult",
    "GuidanceKind",
    "Limits",
    "LoraSpec",
    "ModelDefaults",
    "Suggested",
    "Timings",
    "fields_of",
    "normalise_loras",
    "normalise_request",
    "parse_ref",
    "seeds_of",
    "with_suggested",
]

MAX_SEED = 2**32 - 1
# Images one request may ask for (consecutive seeds, one denoising batch where memory allows).
MAX_IMAGES = 4
SCALE_RANGE = (-2.0, 2.0)
GUIDANCE_RANGE = (0.0, 30.0)
MIN_SIDE = 64
LOCAL_PREFIX = refs.LOCAL_PREFIX
T = TypeVar("T")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# How a served model reads `guidance`: classifier-free guidance (with the negative prompt), a distilled guidance
# embedding (FLUX.1 [dev]: no negative prompt, one pass per step), or not at all (FLUX.1 [schnell]).
GuidanceKind = Literal["cfg", "distilled", "none"]


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA of a request: a Hub repo id, `local:<file>` or a Civitai reference; its scale, optional revision
    and file (Hub repos only)."""

    ref: str
    scale: float = 1.0
    revision: str | None = None
    weight_name: str | None = None


_INTEGER, _NUMBER, _TEXT = "an integer", "a number", "a string"
_SAMPLER = "a string: a sampler name such as 'DPM++ 2M Karras' or a diffusers scheduler class"
_OPTIONS = 'an object of scheduler options, e.g. {"use_karras_sigmas": true, "timestep_spacing": "trailing"}'
_F = RequestField


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


def fields_of(cls: type[GenerateRequest] = GenerateRequest) -> tuple[RequestField, ...]:
    """The request's fields as declared, in order, each with its name."""
    return tuple(replace(f.metadata["request"], name=f.name) for f in fields(cls) if "request" in f.metadata)


REQUEST_FIELDS = fields_of()


@dataclass(frozen=True)
class CheckedRequest(GenerateRequest):
    """A request `normalise_request` has checked: whole numbers in range, defaults filled, a concrete seed.

    `scheduler` is a class name the pool accepts, or None for the pool's own; `sampler` names what runs either
    way (the recipe's `Sampler:`). `defaults_from` says where each default that is not the pool's came from.
    """

    steps: int = 0
    guidance: float = 0.0
    width: int = 0
    height: int = 0
    seed: int = 0
    scheduler_options: SchedulerOptions = ()
    clip_skip: int = 0
    num_images: int = 1
    sampler: str = ""
    defaults_from: tuple[tuple[str, str], ...] = ()
    # The fields the client left to the defaults (of `SUGGESTIBLE`): the LoRAs' recommendations may fill them
    # once they are prepared (`with_suggested`), without checking the request again.
    left_unset: tuple[str, ...] = ()

    @property
    def seeds(self) -> tuple[int, ...]:
        """Each image's seed: consecutive from `seed` (wrapping within the seed range)."""
        return seeds_of(self.seed, self.num_images)


# The tiny pipelines make 64-128 px images; the smallest real base (SD 1.5) makes 512 px ones.
TINY_MAX_SIDE = 128


@dataclass(frozen=True)
class ModelDefaults:
    """The served model's request defaults, the (width, height) presets the UI offers (its family's), its
    scheduler class, the scheduler classes a request may name, the largest `clip_skip` (0: none taken), and which
    inputs it reads: how it reads `guidance` (`GuidanceKind`) and whether it reads the negative prompt."""

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

    def __post_init__(self) -> None:
        # Read back from JSON (the cluster's and a remote Space's `info`) the presets are lists: made tuples
        # here, once; without any (an older peer) the square of the default side is the one preset.
        sizes = tuple((int(w), int(h)) for w, h in self.sizes) or ((self.side, self.side),)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "schedulers", tuple(self.schedulers))

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
        return tuple(warnings)

    @property
    def sampler(self) -> str:
        """The name of the pool's own scheduler ("Euler" for SDXL's)."""
        return sampler_label(self.scheduler, ()) if self.scheduler else ""

    @property
    def samplers(self) -> tuple[str, ...]:
        """The sampler names a request may use here (the UI's menu)."""
        return menu(self.schedulers)


@dataclass(frozen=True)
class Suggested:
    """Defaults a request's LoRAs bring (a speed LoRA's sampler, steps and guidance; a card's recommendations):
    they take the place of the pool's where the client set nothing. `sources` says where each came from."""

    steps: int | None = None
    guidance: float | None = None
    scheduler: str | None = None
    clip_skip: int | None = None
    sources: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Limits:
    max_loras: int
    max_steps: int
    max_prompt_chars: int
    max_images: int = MAX_IMAGES


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of one request."""

    resolve: float = 0.0
    prepare: float = 0.0
    apply: float = 0.0
    inference: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class AdapterUse:
    """What one LoRA of a result was: where it came from and whether the cache had it."""

    ref: str
    revision: str
    weight_name: str
    scale: float
    cache: Literal["hit", "miss"]
    # The file's hash as A1111 writes it in `Lora hashes` (12 hex digits; Civitai's AutoV3).
    hash: str = ""
    # The fine-tune it was trained for when it ran on a pool of another base (a Civitai "Pony" LoRA on SDXL);
    # None when it ran on the base it declares.
    trained_for: str | None = None


@dataclass(frozen=True)
class GenerateResult:
    """What a run made: the first image and its seed, and for a request of several the rest (their seeds follow
    on: `seeds`)."""

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

    @property
    def images(self) -> tuple[Image, ...]:
        return (self.image, *self.more_images)

    @property
    def seeds(self) -> tuple[int, ...]:
        return seeds_of(self.seed, len(self.images))


def seeds_of(seed: int, count: int) -> tuple[int, ...]:
    """`count` consecutive seeds from `seed`, wrapping within 0..MAX_SEED (each a valid request seed)."""
    return tuple((seed + i) % (MAX_SEED + 1) for i in range(count))


def parse_ref(ref: object) -> tuple[Literal["hub", "local", "civitai"], str]:
    """Split a LoRA reference into its kind and name, refusing anything path- or URL-like but Civitai's forms
    (`lora_catalog.civitai.refs`), which become their canonical `civitai:<version>` / `civitai:models/<model>`."""
    civitai = parse_civitai(ref)
    if civitai is not None:
        return "civitai", civitai.canonical
    try:
        if isinstance(ref, str) and refs.is_local_ref(ref.strip()):
            return "local", refs.parse_local_ref(ref.strip()).as_posix()
        return "hub", refs.validate_repo_id(ref)  # type: ignore[arg-type]
    except InvalidRequestError as e:
        raise InvalidRequestError(
            f"{e}; or a local LoRA as 'local:<file>.safetensors'; or a Civitai LoRA: {CIVITAI_ACCEPTED}"
        ) from e


# The fields a LoRA's recommendation may fill where the client left them unset (`Suggested`).
SUGGESTIBLE = ("steps", "guidance", "scheduler", "clip_skip")


def normalise_request(
    request: GenerateRequest, defaults: ModelDefaults, limits: Limits, suggested: Suggested | None = None
) -> CheckedRequest:
    """Check every field and fill defaults (the LoRAs' `suggested` ones before the pool's: `with_suggested`);
    returns a new request with a concrete seed."""
    prompt = _text("prompt", request.prompt, limits.max_prompt_chars, allow_empty=False)
    negative = _text("negative_prompt", request.negative_prompt, limits.max_prompt_chars, allow_empty=True)
    loras = _loras(request.loras, limits.max_loras)
    steps = _int("steps", request.steps, defaults.steps, 1, limits.max_steps)
    guidance = _float("guidance", request.guidance, defaults.guidance, *GUIDANCE_RANGE)
    width = _side("width", request.width, defaults)
    height = _side("height", request.height, defaults)
    seed = _int("seed", request.seed, secrets.randbelow(MAX_SEED + 1), 0, MAX_SEED)
    scheduler, options = choose_scheduler(
        request.scheduler, request.scheduler_options, defaults.scheduler, defaults.schedulers
    )
    clip_skip = _clip_skip(request.clip_skip, 0, defaults)
    if not isinstance(request.lora_defaults, bool):
        raise InvalidRequestError(f"lora_defaults={request.lora_defaults!r} is not accepted; accepted: true, false")
    num_images = _int("num_images", request.num_images, 1, 1, limits.max_images)
    checked = CheckedRequest(
        prompt=prompt,
        negative_prompt=negative,
        loras=loras,
        steps=steps,
        guidance=guidance,
        width=width,
        height=height,
        seed=seed,
        scheduler=scheduler,
        scheduler_options=options,
        clip_skip=clip_skip,
        num_images=num_images,
        lora_defaults=request.lora_defaults,
        sampler=sampler_label(scheduler, options) if scheduler is not None else defaults.sampler,
        left_unset=tuple(name for name in SUGGESTIBLE if getattr(request, name) is None),
    )
    return checked if suggested is None else with_suggested(checked, suggested, defaults)


def with_suggested(checked: CheckedRequest, suggested: Suggested, defaults: ModelDefaults) -> CheckedRequest:
    """`checked` with the LoRAs' `suggested` defaults where its client set nothing (`left_unset`), and where each
    came from; nothing else is checked again. A suggested sampler takes the client's options (`choose_scheduler`
    checks they fit it)."""
    unset = set(checked.left_unset)

    def pick(name: str, value: T, suggestion: T | None) -> T:
        return suggestion if name in unset and suggestion is not None else value

    scheduler, options = checked.scheduler, checked.scheduler_options
    named = pick("scheduler", None, suggested.scheduler)
    if named is not None:
        scheduler, options = choose_scheduler(named, options, defaults.scheduler, defaults.schedulers)
    clip_skip = checked.clip_skip
    if "clip_skip" in unset and suggested.clip_skip is not None and defaults.max_clip_skip:
        clip_skip = min(suggested.clip_skip, defaults.max_clip_skip)
    return replace(
        checked,
        steps=pick("steps", checked.steps, suggested.steps),
        guidance=pick("guidance", checked.guidance, suggested.guidance),
        scheduler=scheduler,
        scheduler_options=options,
        clip_skip=clip_skip,
        sampler=sampler_label(scheduler, options) if scheduler is not None else defaults.sampler,
        defaults_from=tuple((f, source) for f, source in suggested.sources if f in unset or f not in SUGGESTIBLE),
    )


def _clip_skip(value: object, default: int, defaults: ModelDefaults) -> int:
    if defaults.max_clip_skip == 0:
        if value not in (None, 0):
            raise InvalidRequestError(
                f"clip_skip={value!r} is not accepted: this pool's model takes no CLIP skip (its pipeline has no "
                "clip_skip input); accepted: 0 or none"
            )
        return 0
    return _int("clip_skip", value, min(default, defaults.max_clip_skip), 0, defaults.max_clip_skip)


def normalise_loras(value: object, limit: int) -> tuple[LoraSpec, ...]:
    """A request's LoRAs checked and normalised as `normalise_request` does (the pools route on these)."""
    return _loras(value, limit)


def _text(name: str, value: object, limit: int, *, allow_empty: bool) -> str:
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{name} is not valid UTF-8 text (bad character at position {e.start})") from e
    if bad := _CONTROL.search(value):
        raise InvalidRequestError(
            f"{name} holds a control character U+{ord(bad.group()):04X} at position {bad.start()}; "
            "accepted: printable text, spaces, tabs and newlines"
        )
    text = " ".join(value.split())
    if not text and not allow_empty:
        raise InvalidRequestError(f"{name} is empty; accepted: 1 to {limit} characters of text")
    if len(text) > limit:
        raise LimitExceededError(f"{name} has {len(text)} characters; accepted: at most {limit}")
    return text


def _loras(value: object, limit: int) -> tuple[LoraSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"loras must be a list of LoRA specs, got {type(value).__name__}")
    if len(value) > limit:
        raise LimitExceededError(f"{len(value)} LoRAs requested; accepted: at most {limit} per request")
    specs: list[LoraSpec] = []
    for spec in value:
        if not isinstance(spec, LoraSpec):
            raise InvalidRequestError(f"LoRA entry {spec!r} is not a LoraSpec")
        kind, name = parse_ref(spec.ref)
        # A Civitai reference names its version and file itself: a revision or file given with it is dropped, as
        # for a local file.
        ref = f"{LOCAL_PREFIX}{name}" if kind == "local" else name
        revision = _checked(refs.validate_revision, spec.revision) if kind == "hub" else None
        weight_name = _checked(refs.validate_weight_name, spec.weight_name) if kind == "hub" else None
        scale = _float(f"scale of {ref}", spec.scale, 1.0, *SCALE_RANGE)
        specs.append(LoraSpec(ref=ref, scale=scale, revision=revision, weight_name=weight_name))
    identities = [(s.ref, s.revision, s.weight_name) for s in specs]
    if len(set(identities)) != len(identities):
        twice = next(i[0] for i in identities if identities.count(i) > 1)
        raise InvalidRequestError(f"LoRA {twice!r} is listed twice; accepted: each LoRA once, with one scale")
    return tuple(specs)


def _checked(check: Callable[[str | None], str | None], value: object) -> str | None:
    return check(value or None)  # type: ignore[arg-type]


def _int(name: str, value: object, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name}={value!r} is not an integer; accepted: an integer from {low} to {high}")
    if not low <= value <= high:
        error = LimitExceededError if value > high else InvalidRequestError
        raise error(f"{name}={value} is out of range; accepted: an integer from {low} to {high}")
    return value


def _float(name: str, value: object, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{name}={value!r} is not a number; accepted: a number from {low:g} to {high:g}")
    if not low <= value <= high:
        raise InvalidRequestError(f"{name}={value:g} is out of range; accepted: a number from {low:g} to {high:g}")
    return float(value)


def _side(name: str, value: object, defaults: ModelDefaults) -> int:
    side = _int(name, value, defaults.side, MIN_SIDE, defaults.max_side)
    step = defaults.side_multiple
    if side % step:
        raise InvalidRequestError(
            f"{name}={side} is not a multiple of {step}; accepted: {MIN_SIDE} to {defaults.max_side} in {step}s"
        )
    return side
