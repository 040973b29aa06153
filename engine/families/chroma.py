"""Chroma (Chroma1-HD, Base, Flash and their fine-tunes): `ChromaPipeline`, FLUX.1 [schnell]'s DiT with its
per-block modulations replaced by one small network (`distilled_guidance_layer`), T5-XXL alone (no CLIP), 1024 px.

A LoRA adapts the transformer only (diffusers' Chroma loader is `FluxLoraLoaderMixin`, and the pipeline has no
CLIP); every naming that loader reads (diffusers/PEFT, kohya over BFL's fused qkv/linear1, ComfyUI's
`diffusion_model.` with `lora_down`) goes through diffusers' own FLUX converter at the served widths
(`engine.families.bfl_lora`), and BFL's names with `lora_A`/`lora_B` (the flow trainer's, ai-toolkit's), which
diffusers' loader silently ignores, are renamed there to the `lora_down`/`lora_up` form it converts, as FLUX.1's.
HD's card: 40 steps at CFG 3.0 with a negative prompt (CFG runs above 1); sides in 16s; FLUX.1's VAE, so its
previews (the latents are packed as FLUX.1's). T5 may stay in host RAM.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from diffusers import (
    ChromaImg2ImgPipeline,
    ChromaInpaintPipeline,
    ChromaPipeline,
    ChromaTransformer2DModel,
    FlowMatchEulerDiscreteScheduler,
)
from transformers import T5EncoderModel

from engine.families.bfl_blocks import FLUX1_RATIOS, contradicts
from engine.families.bfl_lora import convert_bfl_lora
from engine.families.bfl_parts import LATENT_RGB, SIZE_BUCKETS, TAEF1, VAE
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
from engine.families.tiny import t5_config, tiny_t5_tokenizer, tiny_vae
from engine.requests import CheckedRequest
from engine.storage import LinearSizes
from families.chroma import IDENTITY

__all__ = ["FAMILY", "MEMORY", "ChromaInpaint", "build_tiny_pipeline", "convert_lora"]

# Parameter and buffer values of lodestones/Chroma1-HD as diffusers and transformers build them from its configs
# (transformer/: ChromaTransformer2DModel's defaults are Chroma's; text_encoder/ T5-XXL's encoder, as FLUX.1's;
# vae/ FLUX.1's): 13.75 billion, 27.5 GB in bf16. Of the transformer's 8.9 B, its modulation network holds 278 M
# where FLUX.1's per-block modulations hold 3.3 B. T5 is never adapted and may run from host RAM.
MEMORY = MemorySpec(
    values=(
        ("transformer", 8_899_994_432),
        ("text_encoder", 4_762_310_656),
        ("vae", 83_819_683),
    ),
    host_components=("text_encoder",),
    # Each single block's output projection, 5 x 3072 to 3072 (its largest Linear: no 6 x 3072 modulation).
    largest_values=47_185_920,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer (BFL's blocks, the modulation network, embedders and final layer).
    linears=LinearSizes(8_897_888_256, 2_050_112, 4_214_976),
)
# The attention inputs a LoRA's down factor shows the hidden width on (q/k/v alone, fused, or with the MLP).
_HIDDEN_INPUT = re.compile(r"(to_[qkv]|add_[qkv]_proj|qkv|linear1)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight")


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its attention factors take (Chroma has no CLIP, so no text part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width; no text encoder is adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`ChromaPipeline.lora_state_dict`, FLUX's), at the served transformer's widths.

    BFL's names with PEFT's `lora_A`/`lora_B`, which diffusers' loader silently ignores, are renamed first to the
    form its converter splits (`engine.families.bfl_lora.renamed_bfl_factors`, FLUX.1's too). A layer Chroma lacks
    (FLUX.1's modulations) converts to a diffusers name the served transformer has not, and is refused naming it."""
    return convert_bfl_lora(ChromaPipeline, "Chroma", state_dict, denoiser)


class ChromaInpaint(ChromaInpaintPipeline):
    """diffusers' ChromaInpaintPipeline, where its call works on Chroma's own transformer.

    diffusers 0.42.1's inpainting call reads FLUX.1's `transformer.config.guidance_embeds`, a field Chroma's
    transformer config lacks: every call raised AttributeError. Chroma has no guidance embedding, so the field is
    stated False on the transformer's config (a key only that line reads; `register_to_config` replaces the config,
    no weight is touched) before diffusers' own call runs, unchanged."""

    # diffusers' own signature: the engine passes a mode's call only the arguments it names (engine.pipeline.modes).
    @functools.wraps(ChromaInpaintPipeline.__call__)
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # diffusers' registered components and decorated call are not visible to the type checker.
        dynamic: Any = self
        if "guidance_embeds" not in dynamic.transformer.config:
            dynamic.transformer.register_to_config(guidance_embeds=False)
        call: Any = ChromaInpaintPipeline.__call__
        return call(self, *args, **kwargs)


def served_side(pipe: Pipeline) -> int:
    """ChromaPipeline's default side: its default latent size times the VAE's scale (1024), which FLUX.1's VAE
    states as `sample_size` (a tiny VAE states its own)."""
    return int(pipe.vae.config.sample_size)


def defaults(pipe: Pipeline) -> RunDefaults:
    """Chroma1-HD's card: 40 steps at CFG 3.0 with a negative prompt (ChromaPipeline runs CFG above 1). Sides go
    in the VAE's scale times the 2x2 patches."""
    return RunDefaults(40, 3.0, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor))


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """ChromaPipeline's call: its CFG reads the negative prompt when guidance is above 1."""
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt or None,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


def build_tiny_pipeline(seed: int = 0) -> ChromaPipeline:
    """A tiny Chroma pipeline: 2 double and 2 single blocks 32 wide (FLUX.1's tiny width, as the real models share
    3072: widths never tell them apart), its modulation network (2 layers 32 wide), a T5 encoder 32 wide with its
    tokenizer, FLUX.1's 16-channel VAE in small, and FLUX.1's flow-matching schedule. About 0.1 M parameters; the
    same seed gives the same weights."""
    tokenizer = tiny_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=16 * 4,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=16,
        approximator_hidden_dim=32,
        approximator_layers=2,
    )
    vae = tiny_vae(seed, **VAE)
    torch.manual_seed(seed + 2)
    text_encoder = T5EncoderModel(t5_config(tokenizer))
    # FLUX.1's schedule (dynamic shifting around a megapixel), which Chroma was trained from.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = ChromaPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=ChromaPipeline,
    denoiser="transformer",
    components=("transformer",),
    side=1024,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    # FLUX.1's MLP ratios (FLUX.2 shares the block names, not the widths: bfl_blocks).
    signature=LoraSignature(lora_widths, pipeline_widths, partial(contradicts, FLUX1_RATIOS)),
    preview=PreviewSpec(TAEF1, LATENT_RGB, unpack=ChromaPipeline._unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    image_to_image=ChromaImg2ImgPipeline,
    inpainting=ChromaInpaint,
)
