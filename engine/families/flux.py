"""FLUX.1 ([dev], [schnell] and their fine-tunes): `FluxPipeline`, a DiT with CLIP-L and T5-XXL, 1024 px.

A LoRA adapts the transformer and, in some files, CLIP (never T5: a file's T5 part, which diffusers' converter
drops, is not applied, as in diffusers, with a warning naming it: `T5_PART`); every naming diffusers' `FluxPipeline`
reads (diffusers/PEFT, kohya over BFL's fused qkv/linear1, ComfyUI, XLabs, kohya's CLIP part) is converted by
its own converter, at any served width (`convert_lora`), and so are BFL's names with `lora_A`/`lora_B`, which its
loader silently ignores (renamed first to the ComfyUI form it reads, as Chroma's: `engine.families.bfl_lora`).
The served transformer's `guidance_embeds` sets the defaults ([dev]: distilled guidance, 28 steps at 3.5;
[schnell]: none, 4 at 0); no negative prompt; sides in 16s; previews unpack the packed latents. The reasoning
and sources: docs/internals.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    FluxImg2ImgPipeline,
    FluxInpaintPipeline,
    FluxPipeline,
    FluxTransformer2DModel,
)
from transformers import CLIPTextModel, T5EncoderModel

from engine.families.bfl_blocks import FLUX1_RATIOS, contradicts
from engine.families.bfl_lora import REAL_LINEAR1, convert_bfl_lora, linear1_widths
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
    UnappliedPart,
    Widths,
    head_width,
    hidden_widths,
)
from engine.families.tiny import t5_config, text_config, tiny_t5_tokenizer, tiny_tokenizer, tiny_vae
from engine.requests import CheckedRequest
from engine.storage import LinearSizes
from families.flux import IDENTITY

__all__ = [
    "FAMILY",
    "LATENT_RGB",
    "MEMORY",
    "REAL_LINEAR1",
    "SIZE_BUCKETS",
    "VAE",
    "build_tiny_pipeline",
    "convert_lora",
    "linear1_widths",
]

# A file's T5 part, which diffusers' FLUX converter drops (keeping `lora_unet_`, `lora_te_`, `lora_te1_` only, and
# filtering ComfyUI's `text_encoders.t5xxl.` with a log line at info) and its loader runs the file without:
# sd-scripts' FLUX LoRAs name it `lora_te3_` (networks/lora_flux.py, LORA_PREFIX_TEXT_ENCODER_T5), its first
# FLUX scripts and OneTrainer's `lora_te2_`, ComfyUI's saves `text_encoders.t5xxl.transformer.`.
T5_PART = UnappliedPart("T5", ("lora_te2_", "lora_te3_", "text_encoders.t5xxl."))

# Parameter and buffer values of black-forest-labs/FLUX.1-dev as diffusers and transformers build them from its
# configs (transformer/, text_encoder/ CLIP-L, text_encoder_2/ T5-XXL's encoder, vae/): 16.87 billion, 33.7 GB in
# bf16 ([schnell] lacks the guidance embedding: 10 M fewer). T5 is never adapted (diffusers' loader does not) and
# may run from host RAM: per prompt it takes token ids and gives embeddings, little to move, so where nothing else
# fits the plan leaves its 9.5 GB there and prompts are encoded on the CPU (slower; not measured here).
MEMORY = MemorySpec(
    values=(
        ("transformer", 11_901_408_320),
        ("text_encoder", 123_060_557),
        ("text_encoder_2", 4_762_310_656),
        ("vae", 83_819_683),
    ),
    host_components=("text_encoder_2",),
    # Each double block's AdaLayerNormZero projection, 3072 to 6 x 3072.
    largest_values=56_623_104,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer (BFL's blocks, embedders and final layer).
    linears=LinearSizes(11_898_322_944, 3_065_920, 5_421_440),
    # CLIP-L's MLP.
    largest_encoder_values=2_359_296,
)
# The attention inputs a LoRA's down factor shows the hidden width on (q/k/v alone, fused, or with the MLP).
_HIDDEN_INPUT = re.compile(r"(to_[qkv]|add_[qkv]_proj|qkv|qkv_lora\d?|linear1)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight", ".down.weight")
_TEXT = re.compile(r"^(lora_te1?_|text_encoder\.|text_encoders\.clip_l\.)")
# The CLIP layers a text factor shows the encoder's width on.
_TEXT_INPUT = re.compile(r"q_proj")


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its transformer factors take, and the CLIP width of its text part."""
    text = {name: shape for name, shape in shapes.items() if _TEXT.match(name.lower())}
    transformer = {name: shape for name, shape in shapes.items() if name not in text}
    return Widths(hidden_widths(transformer, _DOWN, _HIDDEN_INPUT), hidden_widths(text, _DOWN, _TEXT_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width and the CLIP encoder's."""
    return Widths(frozenset({head_width(denoiser)}), frozenset(int(e.config.hidden_size) for e in encoders.values()))


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`FluxPipeline.lora_state_dict`), at the served transformer's widths.

    diffusers' kohya converter splits each `linear1` factor at FLUX.1's widths (3072 x 3 + 12288) and asserts
    they add up. On a transformer of other widths (the tiny one), each `linear1` up factor is first padded with
    zero rows to those widths, its rows for q, k, v and the MLP placed at the offsets diffusers splits at, and
    the four factors it gives are cropped back after: the split and its sparse test see exactly the factor
    they would at real width, and zero rows change neither. At real width nothing is padded.
    BFL's names with `lora_A`/`lora_B` are renamed first to ComfyUI's `lora_down`/`lora_up`, which it reads.
    A factor whose rows fit no served width is refused here (IncompatibleLoraError naming both shapes), never
    asserted on; what diffusers' converter cannot read comes out as a ValueError.
    """
    return convert_bfl_lora(FluxPipeline, "FLUX", state_dict, denoiser)


def served_side(pipe: Pipeline) -> int:
    """FluxPipeline's default side: its class's default latent size times the VAE's scale (1024 for FLUX.1),
    which the served VAE's config states as `sample_size` (a tiny VAE states its own)."""
    return int(pipe.vae.config.sample_size)


def defaults(pipe: Pipeline) -> RunDefaults:
    """[dev] (and its fine-tunes) reads guidance through its distilled embedding; [schnell] has none."""
    if pipe.transformer.config.guidance_embeds:
        return RunDefaults(28, 3.5, "distilled", negative_prompt=False, side_multiple=_side_multiple(pipe))
    return RunDefaults(4, 0.0, "none", negative_prompt=False, side_multiple=_side_multiple(pipe))


def _side_multiple(pipe: Pipeline) -> int:
    # The VAE's downsampling times the 2x2 patches the latents are packed into.
    return 2 * int(pipe.vae_scale_factor)


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """FluxPipeline's call: no negative prompt (its true CFG stays off), `guidance` for the distilled embedding."""
    return {
        "prompt": request.prompt,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


def build_tiny_pipeline(seed: int = 0) -> FluxPipeline:
    """A tiny FLUX.1 [dev] pipeline: 2 double and 2 single blocks 32 wide (MLP 128), the distilled guidance
    embedding, CLIP (32 wide) and a T5 encoder with their tokenizers, a 16-channel VAE with FLUX's shift and
    scale, and FLUX.1-dev's scheduler. About 0.2 M parameters; the same seed gives the same weights."""
    tokenizer, tokenizer_2 = tiny_tokenizer(), tiny_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16 * 4,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    vae = tiny_vae(seed, **VAE)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(text_config(tokenizer, hidden_size=32))
    torch.manual_seed(seed + 3)
    text_encoder_2 = T5EncoderModel(t5_config(tokenizer_2))
    # FLUX.1-dev's scheduler/scheduler_config.json.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=FluxPipeline,
    denoiser="transformer",
    components=("transformer", "text_encoder"),
    side=1024,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    unapplied_parts=(T5_PART,),
    # FLUX.2 shares its block names: a LoRA whose MLP widths are FLUX.2's is not FLUX.1's (bfl_blocks).
    signature=LoraSignature(lora_widths, pipeline_widths, partial(contradicts, FLUX1_RATIOS)),
    preview=PreviewSpec(TAEF1, LATENT_RGB, unpack=FluxPipeline._unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    image_to_image=FluxImg2ImgPipeline,
    inpainting=FluxInpaintPipeline,
)
