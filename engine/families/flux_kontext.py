"""FLUX.1 Kontext [dev]: `FluxKontextPipeline`, FLUX.1 [dev]'s transformer reading an input image's tokens beside
the output's, so every request brings an image (the prompt is the instruction). Everything but the pipeline
class, the identity and the call is FLUX.1's (`engine.families.flux`): its LoRA names, converter, widths,
defaults, sizes, previews and memory. Inpainting is diffusers' `FluxKontextInpaintPipeline` over the same
components. The tiny Kontext is the tiny FLUX.1 [dev]'s components with a transformer of its own width.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from diffusers import FluxKontextInpaintPipeline, FluxKontextPipeline, FluxTransformer2DModel

from engine.families import flux
from engine.families.spec import LoraSignature
from engine.requests import CheckedRequest
from families.flux_kontext import IDENTITY

__all__ = ["FAMILY", "build_tiny_pipeline", "call_arguments"]


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """FLUX.1's call, with Kontext's own resizing off: the engine has sized the image already (its own size
    rounded, or the client's target size), where Kontext would snap the image to its ~1 MP training sizes and
    scale the output to `max_area` (1024²) whatever size was asked for; `max_area` is the asked size's."""
    return {**flux.call_arguments(request), "_auto_resize": False, "max_area": request.width * request.height}


def build_tiny_pipeline(seed: int = 0) -> FluxKontextPipeline:
    """A tiny FLUX.1 Kontext [dev]: the tiny FLUX.1 [dev]'s encoders, VAE, tokenizers and scheduler, and a
    transformer of FLUX.1's structure 80 wide (2 heads of 40) where the tiny FLUX.1's is 32 (each tiny pipeline has
    a width of its own), so a LoRA's shapes tell the two tiny pools apart (the real ones share their widths); the
    same seed gives the same weights."""
    made: Any = flux.build_tiny_pipeline(seed)
    torch.manual_seed(seed + 5)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16 * 4,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=40,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(8, 16, 16),
    )
    pipe: Any = FluxKontextPipeline(**{**made.components, "transformer": transformer})
    pipe.set_progress_bar_config(disable=True)
    return pipe


FAMILY = dataclasses.replace(
    flux.FAMILY,
    identity=IDENTITY,
    pipeline_class=FluxKontextPipeline,
    call_arguments=call_arguments,
    signature=LoraSignature(flux.lora_widths, flux.pipeline_widths),
    build_tiny=build_tiny_pipeline,
    image_to_image=None,
    inpainting=FluxKontextInpaintPipeline,
    needs_image=True,
)
