"""SD 2.x (2.0, 2.1 and their 512 px bases): `StableDiffusionPipeline`, a UNet with an OpenCLIP-H text encoder.

What it shares with SD 1.x (names, VAE, preview, pipeline class) is in `engine.families.stable_diffusion`;
its own are its side (768; the served pipeline's config says 512 for the `-base` repos), its cross-attention
width (1024) and linear attention projections. SD 2.1 predicts v; the tiny pipeline does too, with a
cross-attention width of its own (40).
"""

from __future__ import annotations

from diffusers import StableDiffusionPipeline

from engine.families import stable_diffusion as sd
from engine.families.spec import MemorySpec
from engine.storage import LinearSizes
from families.sd2 import IDENTITY

__all__ = ["FAMILY", "build_tiny_pipeline"]

# SDXL's aspect buckets at three quarters of their side (the UI's presets, rounded to multiples of 64 when served).
SIZE_BUCKETS = ((768, 768), (864, 672), (672, 864), (912, 624), (624, 912), (1008, 576), (576, 1008))

# Parameter and buffer values of stabilityai/stable-diffusion-2-1 as diffusers and transformers build them from
# its unet/ and text_encoder/ configs (OpenCLIP ViT-H's text model, 23 layers): 1.29 billion, 2.58 GB in fp16.
MEMORY = MemorySpec(
    values=(("unet", 865_910_724), ("text_encoder", 340_387_917), ("vae", sd.VAE_VALUES)),
    largest_values=sd.LARGEST_VALUES,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the UNet (its convolutions stay bf16).
    linears=LinearSizes(301_219_840, 259_840, 484_608),
    # OpenCLIP-H's MLP.
    largest_encoder_values=4_194_304,
)


def build_tiny_pipeline(seed: int = 0) -> StableDiffusionPipeline:
    """The tiny SD 2.x pipeline in memory (linear attention projections and v-prediction, as SD 2.1's)."""
    return sd.build_tiny_sd(seed, cross_dim=40, linear_projection=True, prediction_type="v_prediction")


FAMILY = sd.family(IDENTITY, side=768, size_buckets=SIZE_BUCKETS, memory=MEMORY, build_tiny=build_tiny_pipeline)
