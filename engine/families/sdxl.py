"""SDXL: `StableDiffusionXLPipeline`, a UNet with two CLIP text encoders, 1024 px.

Its LoRAs show two text encoders (kohya `lora_te1_`/`lora_te2_`, diffusers `text_encoder_2.`) or UNet
attentions with more than one transformer block (SDXL holds 2 or 10 per attention, SD 1.x/2.x one); its
cross-attention width is 2048. The tiny pipeline has SDXL's structure (a `text_time` UNet whose first down
block has no attention, linear projections, `CLIPTextModel` + `CLIPTextModelWithProjection`, two tokenizers)
with a cross-attention width of its own (64), so LoRAs in every SDXL naming scheme load into it.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextModel, CLIPTextModelWithProjection

from engine.families import unet
from engine.families.spec import (
    FamilySpec,
    LatentProjection,
    LoraSignature,
    MemorySpec,
    PreviewSpec,
    RunDefaults,
    fixed_defaults,
)
from engine.families.tiny import TINY_UNET, text_config, tiny_scheduler, tiny_tokenizer, tiny_vae
from engine.storage import LinearSizes
from families.sdxl import IDENTITY

__all__ = ["FAMILY", "build_tiny_pipeline", "max_clip_skip"]

# Some of SDXL's training aspect buckets (about a megapixel each; its report lists them all).
SIZE_BUCKETS = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344))
# ComfyUI, comfy/latent_formats.py, class SDXL (latent_rgb_factors, latent_rgb_factors_bias): fitted on the
# diffusion-space latents of SDXL's VAE, the space a diffusers pipeline hands its per-step callback.
LATENT_RGB = LatentProjection(
    weights=(
        (0.3651, 0.4232, 0.4341),
        (-0.2533, -0.0042, 0.1068),
        (0.1076, 0.1111, -0.0362),
        (-0.3165, -0.2492, -0.2188),
    ),
    bias=(0.1084, -0.0175, -0.0011),
)

# Parameter and buffer values of stabilityai/stable-diffusion-xl-base-1.0 as diffusers and transformers build them
# from its configs (CLIP ViT-L/14's and OpenCLIP bigG's text models): 3.47 billion, 6.94 GB in fp16.
MEMORY = MemorySpec(
    values=(
        ("unet", 2_567_463_684),
        ("text_encoder", 123_060_557),
        ("text_encoder_2", 694_659_917),
        ("vae", 83_653_863),
    ),
    # The up blocks' 3x3 convolutions from 2560 to 1280 channels.
    largest_values=29_491_200,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the UNet (its convolutions stay bf16).
    linears=LinearSizes(2_232_647_680, 1_455_040, 2_706_176),
    # CLIP-G's MLP.
    largest_encoder_values=6_553_600,
    float32_in_fp16=("vae",),
)


def max_clip_skip(pipe: Any) -> int:
    """SDXL's pipeline reads `hidden_states[-(clip_skip + 2)]` of both encoders: at least their first layer."""
    layers = (pipe.text_encoder.config.num_hidden_layers, pipe.text_encoder_2.config.num_hidden_layers)
    return int(min(layers)) - 2


def build_tiny_pipeline(seed: int = 0) -> StableDiffusionXLPipeline:
    """The tiny SDXL pipeline in memory; the same seed gives the same weights."""
    tokenizer = tiny_tokenizer()
    tokenizer_2 = tiny_tokenizer(pad_token="!")
    config = text_config(tokenizer)
    torch.manual_seed(seed)
    denoiser = UNet2DConditionModel(
        **TINY_UNET,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
        cross_attention_dim=64,
    )
    vae = tiny_vae(seed)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(config)
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(config)
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=denoiser,
        scheduler=tiny_scheduler(),
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=StableDiffusionXLPipeline,
    denoiser="unet",
    components=("unet", "text_encoder", "text_encoder_2"),
    side=1024,
    served_side=unet.served_side,
    defaults=fixed_defaults(RunDefaults(steps=25, guidance=5.0)),
    call_arguments=unet.call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=unet.converter(StableDiffusionXLPipeline),
    signature=LoraSignature(unet.lora_widths, unet.pipeline_widths),
    preview=PreviewSpec("madebyollin/taesdxl", LATENT_RGB),
    build_tiny=build_tiny_pipeline,
    extra_schedulers=unet.SPEED_SCHEDULERS,
    max_clip_skip=max_clip_skip,
    memory=MEMORY,
    image_to_image=StableDiffusionXLImg2ImgPipeline,
    inpainting=StableDiffusionXLInpaintPipeline,
)
