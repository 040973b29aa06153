"""Loading a pool's warm pipeline: once, from its family's class, on the configured device and dtype, warmed up."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import torch
from accelerate.utils import send_to_device
from diffusers import AutoencoderKL

from engine.errors import SettingsError
from engine.families.registry import FamilySpec, family_spec
from engine.families.spec import fit_presets
from engine.families.tiny import TINY_SIZES, build_tiny
from engine.pipeline.schedulers import offered_schedulers
from engine.pools.specs import HUB_ID
from engine.requests import ModelDefaults
from engine.settings import Settings

__all__ = ["LoadedPipeline", "load_pipeline", "resolve_device", "resolve_dtype"]

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

    @property
    def is_tiny(self) -> bool:
        return self.defaults.is_tiny

    @property
    def denoiser(self) -> Pipeline:
        """The pipeline's denoiser (its family names the attribute: `unet`, or `transformer` for a DiT)."""
        return getattr(self.pipe, self.family.denoiser)

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
    settings: Settings, *, warm: bool = True, park: bool = False, host_components: tuple[str, ...] = ()
) -> LoadedPipeline:
    """Load `settings.model_id` (a Hub id, a local diffusers folder or a tiny one) and warm it up.

    The class comes from the family of `settings.base_model_id`. With `park`, the weights stay in
    host memory (in the compute dtype) for `engine.pools.pools` to move in when the pool is first used;
    `device` still names where it will compute, and no warm-up runs. `host_components` stay in host RAM
    (the memory plan's choice, among those the family declares it can run there).
    """
    family = family_spec(settings.base_model_id, setting="BASE_MODEL_ID")
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device, family.half_dtype)
    started = time.perf_counter()
    pipe: Pipeline = (
        build_tiny(settings.model_id, seed=0) if settings.loads_tiny else _from_pretrained(settings, family, dtype)
    )
    target = torch.device("cpu") if park else device
    # Casting only when needed: diffusers warns on a cast that may break modules kept in float32.
    cast = None if pipe.dtype == dtype else dtype
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
                    _compute_in_host_ram(component, device)
    else:
        pipe = pipe.to(device=target) if cast is None else pipe.to(device=target, dtype=cast)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - started
    side = family.served_side(pipe)
    max_side = min(settings.max_side, max(2 * side, 256))
    run = family.defaults(pipe)
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
    )
    if defaults.is_tiny:
        # A tiny model's image says nothing more after 4 steps, and is shown at its own small sizes.
        defaults = dataclasses.replace(defaults, steps=4, sizes=fit_presets(side, TINY_SIZES, max_side))
    else:
        defaults = dataclasses.replace(defaults, sizes=family.size_presets(side, max_side))
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
    )
    if not warm or park:
        return loaded
    warmup_s = _warm_up(loaded)
    logger.info(
        "pipeline %s ready on %s/%s: load %.2f s, warm-up %.2f s",
        settings.model_id,
        device,
        str(dtype).removeprefix("torch."),
        load_s,
        warmup_s,
    )
    return dataclasses.replace(loaded, warmup_s=warmup_s)


def _compute_in_host_ram(module: torch.nn.Module, device: torch.device) -> None:
    """A component left in host RAM computes there, called as if it were on `device`: its inputs are brought to
    host RAM and its outputs handed back on `device` (FluxPipeline sends T5 the token ids on its execution device).
    accelerate's offload hooks would move its weights to the device for each call instead, the very bytes the
    plan keeps off it; its `send_to_device` moves the nested arguments and outputs (a ModelOutput too)."""
    host = torch.device("cpu")

    def inputs(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return send_to_device(args, host), send_to_device(kwargs, host)

    def outputs(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        return send_to_device(output, device)

    module.register_forward_pre_hook(inputs, with_kwargs=True)
    module.register_forward_hook(outputs, with_kwargs=True)


def _from_pretrained(settings: Settings, family: FamilySpec, dtype: torch.dtype) -> Pipeline:
    kwargs: dict[str, object] = {"dtype": dtype, "use_safetensors": True, "token": settings.hf_token}
    kwargs |= dict(family.load_options)
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
    loaded.pipe(
        prompt="warm-up",
        num_inference_steps=2,
        width=side,
        height=side,
        generator=torch.Generator("cpu").manual_seed(0),
    )
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)
    return time.perf_counter() - started
