"""What a base-model family declares: the one shape every `engine.families.<family>` module fills in.

A family module builds one `FamilySpec` named `FAMILY`; nothing outside it knows a family's pipeline class,
denoiser, LoRA components, request defaults and which inputs apply, default side, the pipeline call's
arguments, size presets, LoRA signature, converter, preview decoder (and the latents' layout), tiny builder
or model sizes. This module only holds the shape (and imports no torch: `engine.families.registry`, which
`engine.settings` reads, must stay light); code that reads a family reads these fields, never a family name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from PIL import Image

from engine.families.memory_spec import MemorySpec
from engine.images import InputImage
from engine.references import ReferenceFit
from engine.requests import CheckedRequest, GuidanceKind, RequestMode
from families import Family, FamilyIdentity

__all__ = [
    "FamilySpec",
    "FullDifferences",
    "LatentProjection",
    "LoraConverter",
    "LoraSignature",
    "LycorisModules",
    "MemorySpec",
    "PipelineClass",
    "PreviewSpec",
    "RunDefaults",
    "UnappliedPart",
    "VideoDefaults",
    "Widths",
    "fit_presets",
    "fixed_defaults",
    "head_width",
    "hidden_widths",
]

# A diffusers pipeline and its models (their components and configs are registered at run time, which a type
# checker cannot see through; see engine.pipeline.loading.Pipeline).
Pipeline = Any
Module = Any
Shapes = Mapping[str, tuple[int, ...]]
Tensor = Any
# A family's placing of its LoRAs' full differences (`FamilySpec.full_differences`).
FullDifferences = Callable[[Iterable[str]], Mapping[str, tuple[str, ...]]]
# A family's naming of its LyCORIS modules (`FamilySpec.lycoris_modules`): (module name, denoiser) -> its layers.
LycorisModules = Callable[[str, Any], tuple[str, ...] | None]


@dataclass(frozen=True)
class UnappliedPart:
    """A part of a family's LoRA files that diffusers' converter drops by design, its loader then running the file
    without it (FLUX.1's T5): what it is, for the warning, and the file's name prefixes that spell it."""

    what: str
    prefixes: tuple[str, ...]


@dataclass(frozen=True)
class Widths:
    """The input widths a LoRA's factors (or a pipeline's modules) show: the denoiser's and the text encoders'.

    `denoiser` is the width that tells the family's bases apart: a UNet's cross-attention width, a DiT's hidden
    width (its attention projections' input)."""

    denoiser: frozenset[int] = frozenset()
    text: frozenset[int] = frozenset()

    def within(self, other: Widths) -> bool:
        """Every width here is one of `other`'s (a LoRA's factors fit a pipeline's modules)."""
        return self.denoiser <= other.denoiser and self.text <= other.text


@dataclass(frozen=True)
class LoraSignature:
    """How a LoRA made for the family shows in its factors' shapes, before any is loaded: the engine's part of the
    family's row of the claims table (its names are its identity's `Claims`; `families.claims` ranks the rows).

    `lora_widths(shapes)`: the widths a LoRA's factors were made for, read from its header;
    `pipeline_widths(denoiser, text_encoders)`: the same widths of a served pipeline, read from its models.
    `rules_out(shapes)`: the factors' shapes are ones no layer of the family has at any width (FLUX.1's and
    FLUX.2's MLP ratios differ); None: shapes rule nothing out. `widths`: the denoiser widths every model of the
    family has, where they tell it from a family of the same names (FLUX.2 [dev]'s 6144); empty: not declared.
    `checkpoint(names)`: the base (a `MODELS` id) a LoRA's tensor names show it was made for, by a layer only that
    checkpoint of the family has (LTX-2.3's prompt modulation); None: its names fit every checkpoint alike.
    """

    lora_widths: Callable[[Shapes], Widths]
    pipeline_widths: Callable[[Module, Mapping[str, Module]], Widths]
    rules_out: Callable[[Shapes], bool] | None = None
    widths: frozenset[int] = frozenset()
    checkpoint: Callable[[Iterable[str]], str | None] | None = None

    def fits_widths(self, widths: Widths) -> bool | None:
        """Whether the LoRA's denoiser widths are the declared ones (None: none declared, or none shown)."""
        if not self.widths or not widths.denoiser:
            return None
        return widths.denoiser <= self.widths


def hidden_widths(shapes: Shapes, down: tuple[str, ...], hidden_input: re.Pattern[str]) -> frozenset[int]:
    """The input widths of a LoRA's down factors (names ending in one of `down`, lower-cased) on the layers
    `hidden_input` finds (a DiT's attention inputs, which take its hidden width)."""
    return frozenset(
        int(shape[1])
        for name, shape in shapes.items()
        if len(shape) >= 2 and name.lower().endswith(down) and hidden_input.search(name.lower())
    )


def head_width(denoiser: Module) -> int:
    """A served DiT's hidden width: heads x head width (diffusers' BFL and Qwen configs), or its `dim` (Z-Image's)."""
    config = denoiser.config
    if "num_attention_heads" in config and "attention_head_dim" in config:
        return int(config.num_attention_heads) * int(config.attention_head_dim)
    return int(config.dim)


@dataclass(frozen=True)
class LatentProjection:
    """latent channel c -> RGB: rgb = sum_c latent[c] * weights[c] + bias, in [-1, 1]."""

    weights: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)


class LatentUnpacker(Protocol):
    """The pipeline's per-step latents -> (batch, channels, height, width) for an image of `height` x `width`."""

    def __call__(self, latents: Tensor, height: int, width: int, vae_scale_factor: int, /) -> Tensor: ...


@dataclass(frozen=True)
class PreviewSpec:
    """The family's live-preview decoders: a distilled VAE's Hub repo (AutoencoderTiny) and a linear fallback.

    `unpack` turns the latents a step hands its callback into spatial ones (a DiT's are packed into tokens);
    None when they are spatial already (the UNets')."""

    tiny_vae: str | None
    projection: LatentProjection | None
    unpack: LatentUnpacker | None = None
    # Projections for the family's other latent widths (Wan 2.2 TI2V-5B's 48 channels beside Wan 2.1's 16): the
    # linear preview takes the one whose rows match the latents' channels.
    more_projections: tuple[LatentProjection, ...] = ()


@dataclass(frozen=True)
class RunDefaults:
    """A served pipeline's request defaults, and which of a request's inputs it reads.

    `guidance_kind`: `cfg` (classifier-free guidance, which reads the negative prompt), `distilled` (a guidance
    embedding the model was distilled with: one pass per step, no negative prompt) or `none` (no guidance input).
    """

    steps: int
    guidance: float
    guidance_kind: GuidanceKind = "cfg"
    negative_prompt: bool = True
    # Image sides must be multiples of this (FLUX: the VAE's 8 times its 2x2 patches).
    side_multiple: int = 8
    # How its pipeline sizes each reference image it reads (`engine.references`); None: it reads them as given.
    reference_fit: ReferenceFit | None = None


@dataclass(frozen=True)
class VideoDefaults:
    """A video pipeline's frames (`ModelDefaults`' video fields, read from the served pipeline): its default
    frames and rate, its most frames and their rule (`frame_multiple`k+1), and its low-noise stage's default
    guidance where it has two stages (None: one)."""

    num_frames: int
    fps: int
    max_frames: int
    frame_multiple: int = 4
    guidance_2: float | None = None
    # The longest clip its model makes, in seconds (frames / fps: LTX-2's sound lasts the clip); 0: no bound.
    max_seconds: float = 0.0

    def capped(self, most: int) -> VideoDefaults:
        """These frames within `most` (MAX_VIDEO_FRAMES), the default and the most each the largest of the frame
        rule at most that, so that the UI, `/pool_status` and share links offer what a request may ask."""
        step = self.frame_multiple
        highest = max(1, (min(self.max_frames, most) - 1) // step * step + 1)
        return dataclasses.replace(self, num_frames=min(self.num_frames, highest), max_frames=highest)


def fixed_defaults(defaults: RunDefaults) -> Callable[[Pipeline], RunDefaults]:
    """The same defaults for every pipeline of a family (the UNet families: theirs never depend on the weights)."""
    return lambda pipe: defaults


class TinyBuilder(Protocol):
    def __call__(self, seed: int = 0) -> Pipeline: ...


class PipelineClass(Protocol):
    """A diffusers pipeline class, as loading (`from_pretrained`) and the LoRA converters (`lora_state_dict`, a
    classmethod) use it."""

    def from_pretrained(self, pretrained_model_name_or_path: str, /, **kwargs: Any) -> Pipeline: ...

    def lora_state_dict(self, pretrained_model_name_or_path_or_dict: Any, /, **kwargs: Any) -> Any: ...


class LoraConverter(Protocol):
    """What converts a LoRA's names for a family: a file's tensors and the served denoiser in, the tensors in
    diffusers' names (`<component>.<module>.lora_A.weight`, or diffusers' older names) and the network alphas
    read out, by diffusers' own converters (the family's pipeline class's `lora_state_dict`)."""

    def __call__(
        self, state_dict: dict[str, Tensor], denoiser: Module, /
    ) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]: ...


@dataclass(frozen=True)
class FamilySpec:
    """Everything one family needs, from loading its pipeline to judging a LoRA made for it."""

    # What the family is (its name, bases, metadata spellings, key claims, Civitai labels, model ids).
    identity: FamilyIdentity
    # The diffusers class its pipelines load with (never guessed from file names).
    pipeline_class: PipelineClass
    # The pipeline attribute holding the denoiser: `unet` for the UNet families, `transformer` for DiTs.
    denoiser: str
    # Pipeline attributes a LoRA may change (the denoiser and text encoders).
    components: tuple[str, ...]
    # The native image side the size buckets are declared at.
    side: int
    # The side a served pipeline makes by default, read from it (SD 2.1 base: 512, where the family's is 768).
    served_side: Callable[[Pipeline], int]
    # A served pipeline's request defaults and the inputs it reads (FLUX.1 [dev] and [schnell] differ).
    defaults: Callable[[Pipeline], RunDefaults]
    # The pipeline call's arguments for a checked request (the seed's generator and callbacks are added).
    call_arguments: Callable[[CheckedRequest], dict[str, Any]]
    # (width, height) presets at `side`, scaled to the served side; the UI offers the square first.
    size_buckets: tuple[tuple[int, int], ...]
    # Converts kohya/SGM/XLabs/PEFT names for this family (diffusers' own converters).
    convert_lora: LoraConverter
    signature: LoraSignature
    preview: PreviewSpec
    # A random-weight pipeline of the family's real structure, small enough for a CPU (tests, offline demo).
    build_tiny: TinyBuilder
    # Extra `from_pretrained` arguments (SD 1.x/2.x: no safety checker).
    load_options: tuple[tuple[str, object], ...] = ()
    # Scheduler classes a request may name beyond the pipeline's `scheduler.compatibles` (LCM, TCD).
    extra_schedulers: tuple[str, ...] = ()
    # The largest `clip_skip` a loaded pipeline takes (its text encoders' depth); None: the family takes none.
    max_clip_skip: Callable[[Pipeline], int] | None = None
    # Readies a run's own shallow copy of the pipeline for `clip_skip` (a library mismatch worked around on the
    # copy, never on the pool's pipeline: see the family's function); None: nothing to do.
    prepare_clip_skip: Callable[[Pipeline], None] | None = None
    # The half precision `DTYPE=auto` loads it in on a GPU (FLUX.1's activations overflow float16).
    half_dtype: str = "float16"
    # Its pipelines' sizes and the components that may stay in host RAM, for the memory plan.
    memory: MemorySpec = dataclasses.field(default_factory=MemorySpec)
    # Patterns (`re.search`) of the denoiser's Linears whose weight dtype diffusers reads to cast an input (Z-Image's
    # `t_embedder.mlp.0`): a quantized pool keeps them in the compute dtype (`engine.weights.quantized`), since
    # an fp8 weight there would cast the input to fp8. Empty: diffusers reads none.
    keep_dtype_linears: tuple[str, ...] = ()
    # (base repo id, its sizes) for bases of other sizes than `memory`'s (FLUX.2 [klein] 9B beside 4B).
    base_memory: tuple[tuple[str, MemorySpec], ...] = ()
    # The diffusers classes a pool of the family runs a request with an image on, built from the pool's own
    # components (`engine.pipeline.modes`: no weight loaded or copied): image-to-image, and inpainting. None: the
    # family has none in diffusers, and such a request is refused naming what the pool serves.
    image_to_image: PipelineClass | None = None
    inpainting: PipelineClass | None = None
    # The class a request with a reference video runs on (LTX-2's IC-LoRAs: `LTX2InContextPipeline`), built the same
    # way; None: a reference video is refused.
    in_context: PipelineClass | None = None
    # An instruction-editing base (FLUX.1 Kontext): its own pipeline takes the image, and no request comes without.
    needs_image: bool = False
    # The images a request may bring in all (its `image` first, then `images`): several where the family's own
    # pipeline takes a list of references (FLUX.2, Qwen-Image-Edit-2509/2511: the model's own limit), else one; a
    # pool serving no image mode takes none (`engine.pipeline.loading`). Its `/pool_status` says it.
    max_reference_images: int = 1
    # Its inpainting pipeline takes the further images as references beside the image it repaints (FLUX.2
    # [klein]'s `image_reference`); else a mask with references is refused.
    inpaint_references: bool = False
    # Components the family loads itself and hands to `from_pretrained` ((model id, Hub token) -> name: component;
    # Qwen-Image-Edit's processor, read without the video processor its class would ask torchvision for; FLUX.2
    # [dev]'s tokenizer alone, where its processor cannot be imported without torchvision).
    load_components: Callable[[str, str | None], Mapping[str, Any]] | None = None
    # A video family (Wan): its served pipeline's frames (None: an image family). Its pipelines return
    # `frames`, which a result carries in order (`GenerateResult.frames`).
    video: Callable[[Pipeline], VideoDefaults] | None = None
    # Denoiser forwards a step makes with classifier-free guidance on (guidance above 1, diffusers'
    # `do_classifier_free_guidance`): Wan's pipelines run the conditional pass, then the unconditional one (2: each
    # a piece of the device's time with step sharing, `engine.pipeline.inference.run_pieces`); others batch them (1).
    guidance_passes: int = 1
    # The denoiser's blocks (Wan's `blocks`): with step sharing a video's piece of the device is one block
    # (`engine.pipeline.inference.run_pieces`). None: a forward is one piece.
    denoiser_blocks: str | None = None
    # A second-stage component (Wan 2.2 A14B's low-noise `transformer_2`): a LoRA's `scale_2` applies to its
    # weights, its `scale` to the rest. None: one scale for every component.
    second_stage: str | None = None
    # Which stage a LoRA file is for, from its file name and metadata: 0 the first (high-noise), 1 the second
    # (low-noise), None both (engine.prepare.stages). Read only where `second_stage` is set.
    stage_of: Callable[[str, Mapping[str, str]], int | None] | None = None
    # The modes a served pipeline takes, read from it, of those the family's classes serve (a Wan pool of TI2V-5B
    # makes a video from an image too, one of Wan 2.1 text-to-video only). None: every pool all of them.
    pipeline_modes: Callable[[Pipeline], tuple[RequestMode, ...]] | None = None
    # Its LoRAs' full differences (ComfyUI's `.diff` / `.diff_b`, Wan's `.diff_m`): a file's tensor names -> for
    # each full difference among them, the parameters (`component.parameter`, diffusers' names) it is added to at
    # the LoRA's scale (`engine.formats.differences`); a name it cannot place is left out, and refused by name.
    # Set where the identity says so (`FamilyIdentity.full_differences`). None: such tensors are refused as an
    # unsupported variant (`lora_catalog.variants`).
    full_differences: FullDifferences | None = None
    # A family whose pipelines make sound with their video (LTX-2): a served pipeline's waveform rate in samples a
    # second; its output's `audio` (channels x samples) is the result's `audio` (`engine.result_parts.Soundtrack`).
    # None: silent videos or images.
    audio_rate: Callable[[Pipeline], int] | None = None
    # LyCORIS module names the generic naming misses, to the denoiser's modules (Krea 2's original names, its fused
    # `attn.qkv` as its q, k and v, whose ΔW is split by rows: `engine.formats.split`); None: none.
    lycoris_modules: LycorisModules | None = None
    # Parts of its LoRA files that diffusers' converter drops by design and runs the file without (FLUX.1's T5): run
    # so too, with a warning naming them (`engine.formats.plain`). Any other tensor the converter drops is refused.
    unapplied_parts: tuple[UnappliedPart, ...] = ()

    def __post_init__(self) -> None:
        if self.identity.full_differences != (self.full_differences is not None):
            raise ValueError(
                f"{self.identity.label}: its identity's full_differences ({self.identity.full_differences}) and its "
                "spec's placing of them (FamilySpec.full_differences) must be set together"
            )

    @property
    def family(self) -> Family:
        return self.identity.family

    @property
    def stored(self) -> tuple[str, ...]:
        """The components a quantized pool stores quantized, LoRAs as branches beside them: the denoiser, and the
        second stage's (Wan 2.2 A14B's `transformer_2`) where there is one."""
        return (self.denoiser,) if self.second_stage is None else (self.denoiser, self.second_stage)

    def placeholder_image(self, width: int, height: int) -> InputImage | None:
        """The image a request the engine makes itself (a warm-up, a LoRA check, a prefetch) carries: a grey one of
        this size for an editing family, which takes no request without (`needs_image`); None for the others."""
        if not self.needs_image:
            return None
        return InputImage.from_pil(Image.new("RGB", (width, height), (128, 128, 128)))

    def memory_of(self, base_model_id: str) -> MemorySpec:
        """The sizes of a pool serving `base_model_id`: its own where the family declares them, else `memory`."""
        wanted = base_model_id.strip().lower()
        return next((m for base, m in self.base_memory if base.lower() == wanted), self.memory)

    def size_presets(self, side: int, max_side: int, multiple: int = 64) -> tuple[tuple[int, int], ...]:
        """The buckets scaled to `side` (to multiples of `multiple`: 64; a video pool's side multiple, so that
        Wan's 832 x 480 stays its card's size), after the square, those no larger than `max_side`."""
        # Integer true division rounds correctly, so a bucket exactly halfway between two multiples rounds the same
        # whichever native side it is declared at.
        unit = self.side * multiple
        scaled = [(multiple * round(w * side / unit), multiple * round(h * side / unit)) for w, h in self.size_buckets]
        return fit_presets(side, scaled, max_side)


def fit_presets(side: int, sizes: Iterable[tuple[int, int]], max_side: int) -> tuple[tuple[int, int], ...]:
    """The square of `side` first, then `sizes`, each once, those no larger than `max_side`."""
    unique = dict.fromkeys(((side, side), *sizes))
    return tuple((w, h) for w, h in unique if max(w, h) <= max_side)
