"""SD 1.x (1.4, 1.5 and their fine-tunes): `StableDiffusionPipeline`, a UNet with one CLIP-L text encoder, 512 px.

What it shares with SD 2.x (names, VAE, preview, pipeline class) is in `engine.families.stable_diffusion`;
its own are its side, guidance, cross-attention width (768) and convolutional attention projections. The tiny
pipeline has the same structure, with a cross-attention width of its own (48).
"""

from __future__ import annotations

from diffusers import StableDiffusionPipeline

from engine.families import stable_diffusion as sd
from engine.families.spec import MemorySpec
from engine.storage import LinearSizes
from families.sd15 import IDENTITY

__all__ = ["FAMILY", "build_tiny_pipeline"]

# SDXL's aspect buckets at half their side (the UI's presets, rounded to multiples of 64 when served).
SIZE_BUCKETS = ((512, 512), (576, 448), (448, 576), (608, 416), (416, 608), (672, 384), (384, 672))

# Parameter and buffer values of stable-diffusion-v1-5/stable-diffusion-v1-5 as diffusers and transformers build
# them from its unet/ and text_encoder/ configs (CLIP ViT-L/14's text model): 1.07 billion, 2.13 GB in fp16.
MEMORY = MemorySpec(
    values=(("unet", 859_520_964), ("text_encoder", 123_060_557), ("vae", sd.VAE_VALUES)),
    largest_values=sd.LARGEST_VALUES,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the UNet (its convolutions stay bf16).
    linears=LinearSizes(270_049_280, 234_880, 426_496),
    # CLIP-L's MLP.
    largest_encoder_values=2_359_296,
)


def build_tiny_pipeline(seed: int = 0) -> StableDiffusionPipeline:
    """The tiny SD 1.5 pipeline in memory (1x1-convolution attention projections, as SD 1.5's)."""
    return sd.build_tiny_sd(seed, cross_dim=48, linear_projection=False, prediction_type="epsilon")


FAMILY = sd.family(IDENTITY, side=512, size_buckets=SIZE_BUCKETS, memory=MEMORY, build_tiny=build_tiny_pipeline)
