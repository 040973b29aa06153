"""What SD 1.x and SD 2.x truly share: the UNet's layout and names, one CLIP text encoder, the VAE, the pipeline.

Their LoRAs share every tensor name (cross-attention in the first down block, one transformer block per
attention, kohya's single `lora_te_` text encoder): names alone cannot tell them apart, only widths can (SD
1.x's cross-attention is 768 wide, SD 2.x's 1024). So both families' identities claim the same names
(`families.unet_names`), and the origin judgement (`engine.families.origin`) keeps both until a card, the
file's metadata or the served pipelines' widths decide; the ambiguity is coded nowhere else. Their VAE, and so
their latent space, is the same: one preview serves both. Their tiny pipelines differ where the real ones do
(projections, widths).
"""

from __future__ import annotations

import copy
import threading
import weakref
from types import SimpleNamespace
from typing import Any

import torch
from diffusers import (
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextModel

from engine.families import unet
from engine.families.spec import (
    FamilySpec,
    LatentProjection,
    LoraSignature,
    MemorySpec,
    PreviewSpec,
    RunDefaults,
    TinyBuilder,
    fixed_defaults,
)
from engine.families.tiny import TINY_UNET, text_config, tiny_scheduler, tiny_tokenizer, tiny_vae
from families import FamilyIdentity

__all__ = [
    "COMPONENTS",
    "CONVERTER",
    "LARGEST_VALUES",
    "LOAD_OPTIONS",
    "PREVIEW",
    "SCHEDULERS",
    "SIGNATURE",
    "VAE_VALUES",
    "alias_text_model",
    "build_tiny_sd",
    "call_arguments",
    "family",
    "max_clip_skip",
    "served_side",
]

COMPONENTS = ("unet", "text_encoder")
CONVERTER = unet.converter(StableDiffusionPipeline)
served_side = unet.served_side
call_arguments = unet.call_arguments
# Their Hub repos ship a safety checker; a LoRA switchboard serves art, as the SDXL pipeline does.
LOAD_OPTIONS: tuple[tuple[str, object], ...] = (
    ("safety_checker", None),
    ("feature_extractor", None),
    ("requires_safety_checker", False),
)
# The parameter and buffer values of their VAE (`AutoencoderKL`, vae/config.json of stable-diffusion-v1-5 and
# stable-diffusion-2-1: block_out_channels 128/256/512/512, two layers per block, 4 latent channels).
VAE_VALUES = 83_653_863
# Their UNets' largest weight a LoRA may touch: the up blocks' 3x3 convolutions from 2560 to 1280 channels.
LARGEST_VALUES = 29_491_200
# ComfyUI, comfy/latent_formats.py, class SD15 (latent_rgb_factors); `supported_models.SD20` uses it too, and
# TAESD's model card names it compatible with SD 1 and 2 models.
PREVIEW = PreviewSpec(
    "madebyollin/taesd",
    LatentProjection(
        weights=(
            (0.3512, 0.2297, 0.3227),
            (0.3250, 0.4974, 0.2350),
            (-0.2829, 0.1762, 0.2721),
            (-0.2120, -0.2616, -0.7177),
        ),
    ),
)


SIGNATURE = LoraSignature(unet.lora_widths, unet.pipeline_widths)
SCHEDULERS = unet.SPEED_SCHEDULERS


def max_clip_skip(pipe: Any) -> int:
    """The pipeline reads `hidden_states[-(clip_skip + 1)]` of its one encoder: at least its first layer."""
    return int(pipe.text_encoder.config.num_hidden_layers) - 1


def alias_text_model(run: Any) -> None:
    """Let a run of `StableDiffusionPipeline` with `clip_skip` work on transformers 5.6 and later.

    With `clip_skip` set, diffusers (0.42; huggingface/diffusers#14124, open) applies
    `text_encoder.text_model.final_layer_norm`; transformers 5.6 flattened `CLIPTextModel`, whose
    `final_layer_norm` is now its own attribute and `text_model` is gone. `run` is the run's own shallow copy of
    the pipeline (`engine.pipeline.schedulers.run_pipeline`): its text encoder becomes a shallow copy (the same
    modules and weights) that also answers to that one name. The pool's encoder is never given it (other code
    tells a flattened encoder by its lacking `text_model`); a nested encoder (older transformers) is left be.
    One copy per encoder, kept: transformers marks the model it installed its hidden-state hooks through (on the
    shared layers), so a new copy per run would install them again and record every layer twice.
    """
    encoder = run.text_encoder
    if encoder is None or hasattr(encoder, "text_model") or not hasattr(encoder, "final_layer_norm"):
        return
    with _ALIASED_LOCK:
        aliased = _ALIASED.get(encoder)
        if aliased is None:
            aliased = copy.copy(encoder)
            object.__setattr__(aliased, "text_model", SimpleNamespace(final_layer_norm=encoder.final_layer_norm))
            _ALIASED[encoder] = aliased
    run.text_encoder = aliased


_ALIASED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_ALIASED_LOCK = threading.Lock()


def build_tiny_sd(
    seed: int, *, cross_dim: int, linear_projection: bool, prediction_type: str
) -> StableDiffusionPipeline:
    """A tiny SD 1.x/2.x pipeline (no safety checker): cross-attention in the first down block, one transformer
    block per attention, one `CLIPTextModel` as wide as the cross-attention; the same seed gives the same weights."""
    tokenizer = tiny_tokenizer()
    config = text_config(tokenizer, hidden_size=cross_dim)
    torch.manual_seed(seed)
    denoiser = UNet2DConditionModel(
        **TINY_UNET,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=4,
        use_linear_projection=linear_projection,
        cross_attention_dim=cross_dim,
    )
    vae = tiny_vae(seed)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(config)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=denoiser,
        scheduler=tiny_scheduler(prediction_type),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


def family(
    identity: FamilyIdentity,
    *,
    side: int,
    size_buckets: tuple[tuple[int, int], ...],
    memory: MemorySpec,
    build_tiny: TinyBuilder,
) -> FamilySpec:
    """An SD 1.x or 2.x family: everything the two share (above), with what differs between them given: the
    identity, the native side and its size buckets, the memory plan and the tiny builder."""
    return FamilySpec(
        identity=identity,
        pipeline_class=StableDiffusionPipeline,
        denoiser="unet",
        components=COMPONENTS,
        side=side,
        served_side=served_side,
        defaults=fixed_defaults(RunDefaults(steps=25, guidance=7.5)),
        call_arguments=call_arguments,
        size_buckets=size_buckets,
        convert_lora=CONVERTER,
        signature=SIGNATURE,
        preview=PREVIEW,
        build_tiny=build_tiny,
        load_options=LOAD_OPTIONS,
        extra_schedulers=SCHEDULERS,
        max_clip_skip=max_clip_skip,
        prepare_clip_skip=alias_text_model,
        memory=memory,
        image_to_image=StableDiffusionImg2ImgPipeline,
        inpainting=StableDiffusionInpaintPipeline,
    )
