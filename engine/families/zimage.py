"""Z-Image (Turbo and its fine-tunes): `ZImagePipeline`, a single-stream DiT with a Qwen3 text encoder, 1024 px.

A LoRA adapts the transformer only (never Qwen3, as diffusers' loader); every naming diffusers' `ZImagePipeline`
reads (diffusers/PEFT, ai-toolkit/ComfyUI, kohya/musubi with the fused qkv, the dotted form) is converted by its
own converter, and ComfyUI's fused qkv after a rename (`convert_lora`). Turbo's defaults: 9 steps at guidance 0;
above 0 its true CFG reads the negative prompt; sides in 16s. FLUX.1's VAE, so FLUX.1's previews; Qwen3 may
stay in host RAM. The reasoning and sources: docs/internals.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    ZImageImg2ImgPipeline,
    ZImageInpaintPipeline,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from transformers import Qwen3Config, Qwen3Model

from engine.families.bfl_parts import LATENT_RGB, TAEF1, VAE
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
from engine.families.tiny import tiny_qwen_tokenizer, tiny_vae
from engine.requests import CheckedRequest
from engine.storage import LinearSizes
from families.zimage import IDENTITY

__all__ = ["FAMILY", "MEMORY", "build_tiny_pipeline", "convert_lora"]

# Z-Image's model card and demo offer these around a megapixel (multiples of 64), like FLUX.1's.
SIZE_BUCKETS = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344))
# Parameter and buffer values of Tongyi-MAI/Z-Image-Turbo as diffusers and transformers build them from its configs
# (transformer/, text_encoder/ Qwen3-4B, vae/ FLUX.1's): 10.26 billion, 20.5 GB in bf16. Qwen3 is never adapted and
# may run from host RAM (token ids in, embeddings out): with it there, Z-Image fits a 24 GB GPU.
MEMORY = MemorySpec(
    values=(
        ("transformer", 6_154_908_736),
        ("text_encoder", 4_022_468_224),
        ("vae", 83_819_683),
    ),
    host_components=("text_encoder",),
    largest_values=39_321_600,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer.
    linears=LinearSizes(6_153_863_168, 1_853_504, 3_001_216),
)
# The attention inputs a LoRA's down factor shows the hidden width on (q/k/v alone or fused).
_HIDDEN_INPUT = re.compile(r"attention[._](to[._]?[qkv]|qkv)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight", ".lora.down.weight")
# ComfyUI's names over Z-Image's original fused q/k/v (see convert_lora).
_COMFY_QKV = re.compile(r"^(diffusion_model\..+\.attention\.qkv)\.lora_(down|up)\.weight$")


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its attention factors take (Z-Image LoRAs have no text encoder part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width (`dim`); no text encoder is adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`ZImagePipeline.lora_state_dict`); it folds the alphas into the factors.

    diffusers 0.42 splits Z-Image's original fused `attention.qkv` into q, k and v when it comes in kohya names
    or the dotted `.lora.down` form, but passes ComfyUI's `diffusion_model.<block>.attention.qkv.lora_down` on
    unsplit (its own loader then drops it silently: no such layer in diffusers' model). Those are renamed to
    the dotted form first, so diffusers' converter makes the same split it makes for kohya's names.
    What it cannot read comes out as a ValueError (as every family's converter reports it)."""
    renamed = {_COMFY_QKV.sub(r"\1.lora.\2.weight", name): tensor for name, tensor in state_dict.items()}
    try:
        converted = ZImagePipeline.lora_state_dict(renamed)
    except (AssertionError, RuntimeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"diffusers' Z-Image converter could not read it ({type(e).__name__}: {e})") from e
    return converted, None


def served_side(pipe: Pipeline) -> int:
    """ZImagePipeline's default side is 1024, FLUX.1's VAE's `sample_size` (a tiny VAE states its own)."""
    return int(pipe.vae.config.sample_size)


def defaults(pipe: Pipeline) -> RunDefaults:
    """Turbo's: 9 steps (8 transformer passes) without guidance; a guidance above 0 runs true CFG, which reads
    the negative prompt. Sides go in the VAE's scale times the 2x2 patches."""
    return RunDefaults(9, 0.0, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor))


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """ZImagePipeline's call: its CFG reads the negative prompt when guidance is above 0 (and ignores it at 0)."""
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt or None,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


def build_tiny_pipeline(seed: int = 0) -> ZImagePipeline:
    """A tiny Z-Image Turbo pipeline: 2 single-stream blocks and one of each refiner 24 wide (2 heads of 12),
    a Qwen3 encoder 32 wide with its tokenizer, FLUX.1's 16-channel VAE in small, and Turbo's scheduler.
    About 0.3 M parameters (most in the timestep embedder's fixed 256 x 1024 layer); the same seed gives the
    same weights. 24 wide, a width no other tiny pipeline has, so widths tell them apart as they tell the real ones."""
    tokenizer = tiny_qwen_tokenizer()
    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=24,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,
        axes_dims=[4, 4, 4],
        axes_lens=[256, 64, 64],
    )
    vae = tiny_vae(seed, **VAE)
    torch.manual_seed(seed + 2)
    text_encoder = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    # Z-Image-Turbo's scheduler/scheduler_config.json.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=ZImagePipeline,
    denoiser="transformer",
    components=("transformer",),
    side=1024,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths),
    # FLUX.1's autoencoder: TAEF1 and its projection decode Z-Image's latents, which are spatial already.
    preview=PreviewSpec(TAEF1, LATENT_RGB),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    keep_dtype_linears=(r"^t_embedder\.mlp\.0$",),  # diffusers' TimestepEmbedder casts to its weight's dtype
    image_to_image=ZImageImg2ImgPipeline,
    inpainting=ZImageInpaintPipeline,
)
