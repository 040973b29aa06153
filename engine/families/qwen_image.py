"""Qwen-Image (and its fine-tunes): `QwenImagePipeline`, a 20 B dual-stream DiT with a Qwen2.5-VL encoder, 1024 px.

A LoRA adapts the transformer only (never Qwen2.5-VL, as diffusers' loader); every naming diffusers'
`QwenImagePipeline.lora_state_dict` reads (diffusers/PEFT with or without alphas and PEFT's `default.`,
ComfyUI/ai-toolkit's `diffusion_model.`, kohya/musubi-tuner's `lora_unet_`, lightx2v's bare names) is converted
by its own converter. Defaults as diffusers and Qwen's card run it: 50 steps, true CFG 4 (`guidance` is
`true_cfg_scale`; it runs only with a negative prompt, so an empty one is " ", as the card passes); sides in
16s. Qwen2.5-VL (16.6 GB in bf16) may stay in host RAM. Previews: the Wan 2.1 latent projection (Qwen-Image's
VAE encodes into Wan 2.1's latent space) over the unpacked latents; no distilled decoder loads as AutoencoderTiny.
Image-to-image and inpainting are diffusers' `QwenImageImg2ImgPipeline` and `QwenImageInpaintPipeline` over the
same components.
Qwen-Image-Edit LoRAs share the transformer's names and shapes: only what they declare (a card, musubi-tuner's
"Qwen-Image-Edit" metadata) sends them to an edit pool (`engine.families.qwen_image_edit`); one declaring nothing
is judged a Qwen-Image LoRA.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from diffusers import QwenImageImg2ImgPipeline, QwenImageInpaintPipeline, QwenImagePipeline

from engine.families.spec import (
    FamilySpec,
    LoraSignature,
    MemorySpec,
    Module,
    Pipeline,
    PreviewSpec,
    RunDefaults,
    Shapes,
    Tensor,
    Widths,
    head_width,
    hidden_widths,
)
from engine.families.tiny_qwen_image import build_tiny_pipeline
from engine.families.wan_vae_parts import LATENT_RGB
from engine.requests import CheckedRequest
from engine.storage import LinearSizes
from families.qwen_image import IDENTITY

__all__ = ["FAMILY", "LATENT_RGB", "MEMORY", "convert_lora", "unpack_latents"]

# Qwen-Image's model card's sizes (its `aspect_ratios`: 1:1, 16:9, 9:16, 4:3, 3:4, 3:2, 2:3) at 1328 px,
# scaled to the served side.
SIDE = 1328
SIZE_BUCKETS = ((1328, 1328), (1664, 928), (928, 1664), (1472, 1140), (1140, 1472), (1584, 1056), (1056, 1584))
# Parameter and buffer values of Qwen/Qwen-Image as diffusers and transformers build them from its configs
# (transformer/ 60 blocks 3072 wide, text_encoder/ Qwen2.5-VL-7B with its vision tower and LM head, vae/):
# 28.85 billion, 57.7 GB in bf16. Qwen2.5-VL is never adapted and may run from host RAM (token ids in, hidden
# states out): with it there the transformer's 40.9 GB fit a 48 GB GPU.
MEMORY = MemorySpec(
    values=(
        ("transformer", 20_430_401_088),
        ("text_encoder", 8_292_166_824),
        ("vae", 126_892_531),
    ),
    host_components=("text_encoder",),
    # Each block's image and text modulation, 3072 to 6 x 3072.
    largest_values=56_623_104,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer.
    linears=LinearSizes(20_424_818_688, 5_548_096, 9_247_616),
)
# The attention inputs a LoRA's down factor shows the hidden width on (the image stream's q/k/v and the text
# stream's add_q/k/v_proj, which take the text after `txt_in`).
_HIDDEN_INPUT = re.compile(r"attn[._](to[._][qkv]|add[._][qkv][._]proj)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight", ".lora_a.default.weight")
# diffusers' converter reports what it cannot read with these (and ValueError, which passes as it is).
_CONVERTER_ERRORS = (AssertionError, RuntimeError, KeyError, TypeError, AttributeError, IndexError)


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its attention factors take (Qwen-Image LoRAs have no text encoder part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width; no text encoder is adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`QwenImagePipeline.lora_state_dict`), which folds the alphas into the factors.

    diffusers 0.42 converts a file with `.alpha` tensors, PEFT's `default.`, kohya's or ComfyUI's prefix, and
    prefixes every name it converts with `transformer.`: a diffusers-named file with alphas (or `default.`) comes
    out `transformer.transformer.` and its own loader then refuses it (no such layer). Such names lose their
    `transformer.` first, so diffusers' converter gives what it gives for the bare names. Given a copy: where a
    file needs no renaming diffusers pops its alphas from the dict it was handed. What it cannot read comes out
    as a ValueError (as every family's converter reports it)."""
    if _converted_by_diffusers(state_dict):
        state_dict = {name.removeprefix("transformer."): tensor for name, tensor in state_dict.items()}
    try:
        converted = QwenImagePipeline.lora_state_dict(dict(state_dict))
    except _CONVERTER_ERRORS as e:
        raise ValueError(f"diffusers' Qwen-Image converter could not read it ({type(e).__name__}: {e})") from e
    return converted, None


def _converted_by_diffusers(state_dict: Mapping[str, Tensor]) -> bool:
    """diffusers' own test (`QwenImageLoraLoaderMixin.lora_state_dict`) for a file its converter renames."""
    return any(
        name.endswith(".alpha") or name.startswith(("lora_unet_", "diffusion_model.")) or "default." in name
        for name in state_dict
    )


def served_side(pipe: Pipeline) -> int:
    """QwenImagePipeline's default side: its default latent size times the VAE's scale (1024); a tiny VAE's
    config states its own (`sample_size`)."""
    stated = getattr(pipe.vae.config, "sample_size", None)
    return int(stated) if stated else int(pipe.default_sample_size) * int(pipe.vae_scale_factor)


def defaults(pipe: Pipeline) -> RunDefaults:
    """diffusers' and the card's: 50 steps at true CFG 4, which reads the negative prompt; sides in the VAE's
    scale times the 2x2 patches."""
    return RunDefaults(50, 4.0, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor))


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """QwenImagePipeline's call: `guidance` is its `true_cfg_scale`, which runs only above 1 and with a negative
    prompt (Qwen's card passes " " for none); its `guidance_scale` is for guidance-distilled models, not this."""
    cfg = request.guidance > 1
    return {
        "prompt": request.prompt,
        "negative_prompt": (request.negative_prompt or " ") if cfg else None,
        "true_cfg_scale": request.guidance,
        "num_inference_steps": request.steps,
        "width": request.width,
        "height": request.height,
    }


def unpack_latents(latents: Tensor, height: int, width: int, vae_scale_factor: int) -> Tensor:
    """The packed latents as one spatial frame (diffusers unpacks them to its VAE's video layout)."""
    return QwenImagePipeline._unpack_latents(latents, height, width, vae_scale_factor)[:, :, 0]


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=QwenImagePipeline,
    denoiser="transformer",
    components=("transformer",),
    side=SIDE,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths),
    preview=PreviewSpec(None, LATENT_RGB, unpack=unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    image_to_image=QwenImageImg2ImgPipeline,
    inpainting=QwenImageInpaintPipeline,
)
