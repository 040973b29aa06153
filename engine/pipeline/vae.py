"""`VAE_ID`'s fit and a half-precision VAE kept in float32: what loading (`engine.pipeline.loading`) does to a VAE.

`VAE_ID` replaces a pool's VAE only where its latent space (channels, scaling and shift factors, read from its
config) is the pool's own VAE's, or every image would be decoded from the wrong latents with no error.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from diffusers import AutoencoderKL

from engine.settings import Settings

__all__ = ["vae_in_float32", "vae_mismatch"]

Pipeline = Any
# The config fields that fix a VAE's latent space: two VAEs agreeing on them decode each other's latents.
_LATENT_SPACE = ("latent_channels", "scaling_factor", "shift_factor")


def vae_mismatch(settings: Settings) -> str | None:
    """Why `VAE_ID` does not fit the pipeline `settings.model_id` names (its latent space differs from the
    pipeline's own VAE's), or None when it fits or there is nothing to fit (no VAE_ID; a tiny pipeline, which
    keeps its own VAE). Reads both configs only (from the Hub cache or a folder), never the weights."""
    if not settings.vae_id or settings.loads_tiny:
        return None
    own = _latent_space(AutoencoderKL.load_config(settings.model_id, subfolder="vae", token=settings.hf_token))
    override = _latent_space(AutoencoderKL.load_config(settings.vae_id, token=settings.hf_token))
    differ = [
        f"{name} {override[name]} where its own VAE has {own[name]}"
        for name in _LATENT_SPACE
        if override[name] != own[name]
    ]
    if not differ:
        return None
    return (
        f"VAE_ID={settings.vae_id!r} does not fit {settings.model_id} ({'; '.join(differ)}): its images would be "
        "decoded from the wrong latents; accepted: a VAE of the same latent space as the pool's own"
    )


def _latent_space(config: dict[str, Any]) -> dict[str, object]:
    # A config saved without a field means the class's default (diffusers' own reading of it).
    defaults = inspect.signature(AutoencoderKL.__init__).parameters
    return {name: config.get(name, defaults[name].default) for name in _LATENT_SPACE}


def vae_in_float32(pipe: Pipeline) -> None:
    """Keep a half-precision VAE its config marks `force_upcast` in float32, once, at load.

    SDXL's pipelines would otherwise upcast it for each decode and cast it back afterwards (`upcast_vae`,
    deprecated: a FutureWarning per request), re-pointing its parameters twice per request, so a pool's flat
    buffer (`engine.pools.flat`) would no longer hold them. Widened once, it computes with the very values that
    upcast gave it; the latents it is handed (in the denoiser's dtype) are widened where its decode takes them.
    Only pipelines that would upcast (those with `upcast_vae`) are touched: SD 1.5's decodes in half precision.
    """
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(pipe, "upcast_vae"):
        return
    if vae.dtype != torch.float16 or not vae.config.force_upcast:
        return
    vae.to(dtype=torch.float32)
    # `_decode` and `tiled_decode` hand the latents to post_quant_conv (when the VAE has one), then the decoder.
    for module in (vae.post_quant_conv, vae.decoder):
        if module is not None:
            module.register_forward_pre_hook(_widened)


def _widened(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
