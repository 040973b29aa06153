"""Loading a pool's warm pipeline: once, from its family's class, on the configured device and dtype, warmed up.

With `COMPILE` set, the warm-up also compiles the family's denoiser for each size preset
(`engine.pipeline.compiled`): the compile time is part of the warm-up, reported on its own.

`VAE_ID` replaces a pool's VAE only where it fits: its latent space (channels, scaling and shift factors, read
from its config) must be the pool's own VAE's, or every image would be decoded from the wrong latents with no
error (SDXL's fp16-fix VAE scales by 0.13025, SD 1.5's latents by 0.18215). A pool it does not fit is refused at
start (`vae_mismatch`); with several pools, `engine.pools.pools.build_pools` gives it only to those it fits.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import torch
from diffusers import AutoencoderKL

from engine.errors import SettingsError
from engine.families.registry import FamilySpec, family_spec
from engine.families.spec import fit_presets
from engine.families.tiny import TINY_SIZES, build_tiny
from engine.models import HUB_ID
from engine.pipeline.aot import AotDenoiser, AotPackage, capture_calls, compile_package, inductor_options
from engine.pipeline.compiled import CompiledDenoiser, check_compilable, compile_denoiser, configure_caches
from engine.pipeline.encoders import ENCODER_CACHE_BYTES, run_from_host_ram
from engine.pipeline.gguf_load import gguf_components, gguf_denoiser, stored, tiny_with_gguf
from engine.pipeline.modes import default_strength, image_arguments, mode_class, served_modes
from engine.pipeline.schedulers import offered_schedulers
from engine.pipeline.vae import vae_in_float32, vae_mismatch
from engine.requests import TINY_MAX_SIDE, CheckedRequest, ModelDefaults
from engine.settings import Settings
from engine.storage import BRANCHED, unplanned_storage
from engine.weights.gguf import gguf_quant_types
from families import base_of

__all__ = [
    "LoadedPipeline",
    "load_pipeline",
    "package_denoiser",
    "resolve_device",
    "resolve_dtype",
    "warm_up",
]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# A diffusers pipeline: its components (unet, text encoders, ...) are registered at run time, which a type
# checker cannot see through diffusers' own annotations; code reading them treats the pipeline as dynamic.
Pipeline = Any


@dataclass(frozen=True)
class LoadedPipeline:
    pipe: Pipeline
    model_id: str
    base_model_id: str
    device: torch.device
    dtype: torch.dtype
    defaults: ModelDefaults
    load_s: float
    warmup_s: float
    family: FamilySpec
    # Components the memory plan left in host RAM (`MemorySpec.host_components`): never moved to the device.
    host_components: tuple[str, ...] = ()
    # The denoiser's weight storage: "native" (the pool's dtype), "fp8" (engine.weights.quantized), "int4"
    # (engine.weights.int4) or "gguf" (a GGUF file's blocks: engine.weights.gguf), the last three with LoRAs as
    # low-rank branches of `branch_rank` (engine.weights.branches).
    storage: str = "native"
    branch_rank: int = 0
    # A GGUF denoiser's linears' quant types, most first (`engine.weights.gguf.gguf_quant_types`); else "".
    gguf_types: str = ""

    @property
    def is_tiny(self) -> bool:
        return self.defaults.is_tiny

    @property
    def denoiser(self) -> Pipeline:
        """The pipeline's denoiser (its family names the attribute: `unet`, or `transformer` for a DiT)."""
        return getattr(self.pipe, self.family.denoiser)

    @property
    def compiled(self) -> CompiledDenoiser | AotDenoiser | None:
        """The denoiser's compiled forward (COMPILE), with its counts; None while it runs eager."""
        forward = self.denoiser.__dict__.get("forward")
        return forward if isinstance(forward, CompiledDenoiser | AotDenoiser) else None

    @property
    def model_name(self) -> str:
        """The model as results name it (a recipe's `Model:`): its Hub id, or a local folder's name, never its path."""
        return self.model_id if HUB_ID.match(self.model_id) else PurePath(self.model_id).name

    @property
    def components(self) -> tuple[str, ...]:
        """The pipeline attributes a LoRA may change in this family."""
        return self.family.components


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SettingsError(f"DEVICE={setting!r} but no CUDA device is available; accepted here: auto, cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SettingsError(f"DEVICE={setting!r} but MPS is not available; accepted here: auto, cpu")
    return device


def resolve_dtype(setting: str, device: torch.device, half: str = "float16") -> torch.dtype:
    """`DTYPE`'s dtype on `device`; `auto` is the family's half precision (`half`) on a GPU, float32 on the CPU."""
    if setting == "auto":
        return _DTYPES[half] if device.type in ("cuda", "mps") else torch.float32
    return _DTYPES[setting]


def load_pipeline(
    settings: Settings,
    *,
    warm: bool = True,
    park: bool = False,
    host_components: tuple[str, ...] = (),
    storage: str | None = None,
) -> LoadedPipeline:
    """Load `settings.model_id` (a Hub id, a local diffusers folder or a tiny one) and warm it up.

    The class comes from the family of `settings.base_model_id`. With `park`, the weights stay in
    host memory (in the compute dtype) for `engine.pools.pools` to move in when the pool is first used;
    `device` still names where it will compute, and no warm-up runs. `host_components` stay in host RAM
    (the memory plan's choice, among those the family declares it can run there). `storage` "fp8" ("int4") stores the
    denoiser's linears in fp8 with LoRA branches of `LORA_MAX_RANK` (engine.weights.quantized), quantized in host
    memory before anything moves to the device; None: as QUANTIZE gives it without a plan (`build_pools` passes the
    memory plan's answer, `engine.pools.plan.storage_to_load`).
    """
    # A GGUF denoiser's storage is its file's, whatever QUANTIZE says (MODELS refuses a suffix beside it).
    storage = "gguf" if settings.gguf is not None else storage or unplanned_storage(settings.quantize)
    family = family_spec(settings.base_model_id, setting="BASE_MODEL_ID")
    mismatch = vae_mismatch(settings)
    if mismatch is not None:
        raise SettingsError(mismatch)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device, family.half_dtype)
    _check_compile(settings, device)
    started = time.perf_counter()
    pipe = _build(settings, family, dtype)
    # Every stored component (the denoiser; Wan 2.2 A14B's transformer_2 too) in `storage`.
    pipe, cast = stored(pipe, family, dtype, storage, settings)
    pipe = _place(pipe, settings, family, device, cast=cast, park=park, host_components=host_components)
    vae_in_float32(pipe)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - started
    defaults = _defaults(pipe, family, settings)
    loaded = LoadedPipeline(
        pipe=pipe,
        model_id=settings.model_id,
        base_model_id=settings.base_model_id,
        device=device,
        dtype=dtype,
        defaults=defaults,
        load_s=load_s,
        warmup_s=0.0,
        family=family,
        host_components=host_components,
        storage=storage,
        branch_rank=settings.lora_max_rank if storage in BRANCHED else 0,
        gguf_types="; ".join(gguf_quant_types(getattr(pipe, c)) for c in family.stored) if storage == "gguf" else "",
    )
    if not warm or park:
        return loaded
    return warm_up(loaded, settings)


def _check_compile(settings: Settings, device: torch.device) -> None:
    if settings.compile != "off":
        # Refused before the weights are read: a mode this device cannot run, or one that would bake weights in
        # (on ZeroGPU the denoiser is compiled ahead of time: engine.pipeline.aot).
        if settings.zero_gpu:
            inductor_options(settings.compile)
        else:
            check_compilable(settings.compile, device)


def _place(
    pipe: Pipeline,
    settings: Settings,
    family: FamilySpec,
    device: torch.device,
    *,
    cast: torch.dtype | None,
    park: bool,
    host_components: tuple[str, ...],
) -> Pipeline:
    """The pipeline on its device (the CPU when parked) cast to `cast` (None: as it is), `host_components` left
    in host RAM."""
    target = torch.device("cpu") if park else device
    if host_components:
        refused = sorted(set(host_components) - set(family.memory.host_components))
        if refused:
            raise SettingsError(
                f"{settings.model_id} cannot run {', '.join(refused)} from host RAM; accepted: "
                f"{', '.join(family.memory.host_components) or 'none of its components'}"
            )
        # Component by component, so that those left in host RAM never visit the device.
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module):
                component.to(device=torch.device("cpu") if name in host_components else target, dtype=cast)
                if name in host_components:
                    # Its outputs are kept for recent prompts only where no LoRA or pivotal token changes it.
                    cache = None if name in family.components else ENCODER_CACHE_BYTES
                    run_from_host_ram(component, device, cache_bytes=cache)
    else:
        pipe = pipe.to(device=target) if cast is None else pipe.to(device=target, dtype=cast)
    return pipe


def _defaults(pipe: Pipeline, family: FamilySpec, settings: Settings) -> ModelDefaults:
    """The served model's request defaults: the family's, with its base's own steps and guidance where it
    declares them (a checkpoint's card: `Base.steps`, `Base.guidance`), its sizes around the pipeline's own side, up
    to its base's largest side (`MemorySpec.largest_side`; a tiny pipeline's: twice its own); a video pool's frames
    within MAX_VIDEO_FRAMES and its base's planned size (`MemorySpec.video_size`), which bounds its videos' tokens
    and is offered among the sizes."""
    side = family.served_side(pipe)
    memory = family.memory_of(settings.base_model_id)
    declared = memory.largest_side if side > TINY_MAX_SIDE else 0
    max_side = min(settings.max_side, declared or max(2 * side, 256))
    run = family.defaults(pipe)
    if (base := base_of(settings.base_model_id)) is not None:
        steps = run.steps if base.steps is None else base.steps
        run = dataclasses.replace(run, steps=steps, guidance=run.guidance if base.guidance is None else base.guidance)
    modes = served_modes(family)
    if family.pipeline_modes is not None:
        own = family.pipeline_modes(pipe)
        modes = tuple(mode for mode in modes if mode in own)
    takes_images = any(mode != "text-to-image" for mode in modes)
    defaults = ModelDefaults(
        steps=run.steps,
        guidance=run.guidance,
        side=side,
        max_side=max_side,
        scheduler=type(pipe.scheduler).__name__,
        schedulers=offered_schedulers(pipe.scheduler, family.extra_schedulers),
        max_clip_skip=family.max_clip_skip(pipe) if family.max_clip_skip is not None else 0,
        guidance_kind=run.guidance_kind,
        negative_prompt=run.negative_prompt,
        side_multiple=run.side_multiple,
        strength=default_strength(mode_class(family, "image-to-image")),
        inpaint_strength=default_strength(mode_class(family, "inpainting")),
        needs_image=family.needs_image,
        modes=modes,
        max_reference_images=family.max_reference_images if takes_images else 0,
        inpaint_references=family.inpaint_references and "inpainting" in modes,
        reference_fit=run.reference_fit if takes_images else None,
        reference_video=family.in_context is not None,
        base_model=settings.base_model_id,
    )
    if family.video is not None:
        video = family.video(pipe).capped(settings.max_video_frames)
        defaults = dataclasses.replace(defaults, video=True, video_plan=memory.video_size, **dataclasses.asdict(video))
    if defaults.is_tiny:
        # A tiny model's image says nothing more after 4 steps, and is shown at its own small sizes.
        defaults = dataclasses.replace(defaults, steps=4, sizes=fit_presets(side, TINY_SIZES, max_side))
    else:
        # A video pool's buckets in its own side multiple (each within its plan's tokens), then its base's card
        # size (720P's 1280 x 720) both ways.
        card = [memory.video_size[1:], memory.video_size[:0:-1]] if defaults.video and memory.video_size else []
        presets = family.size_presets(side, max_side, run.side_multiple if defaults.video else 64)
        sizes = (*presets, *(size for size in card if max(size) <= max_side))
        defaults = dataclasses.replace(defaults, sizes=tuple(dict.fromkeys(sizes)))
    return defaults


def warm_up(
    loaded: LoadedPipeline,
    settings: Settings,
    *,
    backend: str = "inductor",
    sizes: Sequence[tuple[int, int]] | None = None,
    cudagraphs: bool = True,
) -> LoadedPipeline:
    """Run the pipeline once (and with `COMPILE`, compile its denoiser for every size preset); on the device.

    `backend` and `sizes` (default: the presets) are for tests and benchmarks: dynamo's `aot_eager`, fewer sizes.
    `cudagraphs=False`: compiled without the mode's CUDA graphs (a pool that will move; `engine.pools.pools`).
    """
    warmup_s = _warm_up(loaded)
    compiled = None
    if settings.compile != "off":
        check_compilable(settings.compile, loaded.device)
        configure_caches(settings.compile_cache_dir)
        compiled = compile_denoiser(
            loaded.denoiser,
            settings.compile,
            loaded.defaults.sizes if sizes is None else sizes,
            lambda w, h: _run_once(loaded, w, h),
            backend=backend,
            cudagraphs=cudagraphs,
        )
        warmup_s += compiled.compile_s
    logger.info(
        "pipeline %s ready on %s/%s: load %.2f s, warm-up %.2f s%s",
        loaded.model_id,
        loaded.device,
        str(loaded.dtype).removeprefix("torch."),
        loaded.load_s,
        warmup_s,
        f" (compiling {compiled.shapes} shapes included)" if compiled else "",
    )
    return dataclasses.replace(loaded, warmup_s=warmup_s)


def _build(settings: Settings, family: FamilySpec, dtype: torch.dtype) -> Pipeline:
    """The pipeline as read or built: a tiny one (its denoiser from the pool's GGUF file where it names one), or
    `_from_pretrained`'s."""
    if not settings.loads_tiny:
        return _from_pretrained(settings, family, dtype)
    return build_tiny(settings.model_id, seed=0) if settings.gguf is None else tiny_with_gguf(settings, family, dtype)


def _from_pretrained(settings: Settings, family: FamilySpec, dtype: torch.dtype) -> Pipeline:
    kwargs: dict[str, object] = {"dtype": dtype, "use_safetensors": True, "token": settings.hf_token}
    kwargs |= dict(family.load_options)
    if family.load_components is not None:
        kwargs |= family.load_components(settings.model_id, settings.hf_token)
    if settings.gguf is not None:
        kwargs |= {c: gguf_denoiser(settings, family, dtype, component=c) for c in gguf_components(settings, family)}
    loader = family.pipeline_class
    if settings.vae_id:
        kwargs["vae"] = AutoencoderKL.from_pretrained(settings.vae_id, dtype=dtype, token=settings.hf_token)
    if dtype == torch.float16:
        try:
            return loader.from_pretrained(settings.model_id, variant="fp16", **kwargs)
        except (OSError, ValueError) as e:
            logger.info("no fp16 variant of %s (%s); loading the default weights", settings.model_id, e)
    return loader.from_pretrained(settings.model_id, **kwargs)


@torch.inference_mode()
def _warm_up(loaded: LoadedPipeline) -> float:
    started = time.perf_counter()
    side = min(loaded.defaults.side, 512)
    request = _warm_up_request(loaded, side, side)
    # The family's own call: an editing pool's keeps the size (FLUX.1 Kontext's would scale it to 1 MP).
    loaded.pipe(**_warm_up_call(loaded, request), generator=torch.Generator("cpu").manual_seed(0))
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)
    return time.perf_counter() - started


def package_denoiser(
    loaded: LoadedPipeline, mode: str, *, sizes: Sequence[tuple[int, int]] | None = None
) -> tuple[AotPackage, ...]:
    """The denoiser compiled ahead of time (ZeroGPU), one package per size preset, none holding the weights.

    Runs on the device (ZeroGPU: inside the start-up GPU call); `sizes` (default: the presets) for tests.
    """
    chosen = loaded.defaults.sizes if sizes is None else sizes
    calls = capture_calls(loaded.denoiser, chosen, lambda w, h: _run_once(loaded, w, h))
    return tuple(compile_package(loaded.denoiser, args, kwargs, mode) for args, kwargs in calls)


@torch.inference_mode()
def _run_once(loaded: LoadedPipeline, width: int, height: int) -> None:
    """One short run at this size, with the family's guidance (a request's batch): what compiles a shape. The
    family's own call (an editing pool's keeps its size: FLUX.1 Kontext's would scale it to 1 MP)."""
    request = _warm_up_request(loaded, width, height)
    loaded.pipe(
        **_warm_up_call(loaded, request),
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="latent",
    )


def _warm_up_request(loaded: LoadedPipeline, width: int, height: int) -> CheckedRequest:
    """A short request at this size, with the family's placeholder image (an editing pipeline runs on one)."""
    image = loaded.family.placeholder_image(width, height)
    return CheckedRequest(
        prompt="warm-up", steps=2, guidance=loaded.defaults.guidance, width=width, height=height, image=image
    )


def _warm_up_call(loaded: LoadedPipeline, request: CheckedRequest) -> dict[str, Any]:
    return {**loaded.family.call_arguments(request), **image_arguments(loaded.pipe, request)}
