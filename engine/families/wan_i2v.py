"""Wan 2.1 image-to-video (14B at 480P and 720P): `WanImageToVideoPipeline`, Wan's video DiT taking the image's
latents beside the noise and its CLIP features through the cross-attention's image keys and values. Every request
brings its image (the first frame: `needs_image`); everything else is Wan's (`engine.families.wan`: the converter,
widths, defaults, frames, previews). A text-to-video Wan LoRA runs here too: diffusers' converter leaves the image
layers alone, and so does the exact swap. The CLIP image encoder, like UMT5, is never adapted.
"""

from __future__ import annotations

import dataclasses

from diffusers import WanImageToVideoPipeline

from engine.families import wan
from engine.families.spec import PreviewSpec
from engine.families.tiny_wan import build_tiny_i2v_pipeline
from engine.families.wan_memory import MEMORY_I2V_480P, MEMORY_I2V_720P
from families.wan_i2v import IDENTITY, MODEL_ID_720P

__all__ = ["FAMILY"]

# Wan's spec, by its differences: its pipeline, its own tiny model and sizes, an image on every request (its own
# pipeline takes it: no separate image-to-image class, no modes read from the pipeline), Wan 2.1's previews only.
FAMILY = dataclasses.replace(
    wan.FAMILY,
    identity=IDENTITY,
    pipeline_class=WanImageToVideoPipeline,
    preview=PreviewSpec(None, wan.LATENT_RGB, unpack=wan.unpack_latents),
    build_tiny=build_tiny_i2v_pipeline,
    memory=MEMORY_I2V_480P,
    base_memory=((MODEL_ID_720P, MEMORY_I2V_720P),),
    image_to_image=None,
    pipeline_modes=None,
    needs_image=True,
)
