"""Wan 2.1 image-to-video (14B at 480P and 720P): `WanImageToVideoPipeline`, Wan's video DiT taking the image's
latents beside the noise and its CLIP features through the cross-attention's image keys and values. Every request
brings its image (the first frame: `needs_image`); everything else is Wan's (`engine.families.wan`: the converter,
widths, defaults, frames, previews). A text-to-video Wan LoRA runs here too: diffusers' converter leaves the image
layers alone, and so does the exact swap. The CLIP image encoder, like UMT5, is never adapted.
"""

from __future__ import annotations

from diffusers import WanImageToVideoPipeline

from engine.families import wan
from engine.families.spec import FamilySpec, LoraSignature, PreviewSpec
from engine.families.tiny_wan import build_tiny_i2v_pipeline
from engine.families.wan_memory import MEMORY_I2V_480P, MEMORY_I2V_720P
from families.wan_i2v import IDENTITY, MODEL_ID_720P

__all__ = ["FAMILY"]

FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=WanImageToVideoPipeline,
    denoiser="transformer",
    components=("transformer",),
    side=wan.SIDE,
    served_side=wan.served_side,
    defaults=wan.defaults,
    call_arguments=wan.call_arguments,
    size_buckets=wan.SIZE_BUCKETS,
    full_differences=wan.full_differences,
    convert_lora=wan.convert_lora,
    signature=LoraSignature(wan.lora_widths, wan.pipeline_widths),
    preview=PreviewSpec(None, wan.LATENT_RGB, unpack=wan.unpack_latents),
    build_tiny=build_tiny_i2v_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY_I2V_480P,
    base_memory=((MODEL_ID_720P, MEMORY_I2V_720P),),
    needs_image=True,
    video=wan.video,
)
