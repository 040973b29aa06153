"""Krea 2 (Turbo, Raw and their fine-tunes): `Krea2Pipeline`, a 12.8 B single-stream DiT 6144 wide with gated GQA
attention, read from 12 layers of a Qwen3-VL-4B encoder through its own text-fusion stage; Qwen-Image's VAE; 1024 px.

A LoRA adapts the transformer only (never Qwen3-VL, as diffusers' loader); every naming diffusers'
`Krea2Pipeline.lora_state_dict` reads (diffusers/PEFT, the original names under `diffusion_model.` or
`base_model.model.`) is converted by its own converter, and kohya's factors, alphas and `lora_unet_` names, which
it refuses, after a rename (`engine.families.krea2_names`); LyCORIS modules in the original names too, the
original fused `attn.qkv` split into q, k and v by rows. Defaults from the served pipeline: a distilled one
(Turbo's `is_distilled`) 8 steps at guidance 0, else Krea2Pipeline's own 28 at 4.5 (Raw's); its CFG runs whenever
guidance is above 0 (1 is CFG already) and reads the negative prompt; sides in 16s. Previews: the Wan 2.1 latent
projection (Qwen-Image's VAE encodes into its space) over the unpacked latents. Qwen3-VL may stay in host RAM.
diffusers has no image-to-image or inpainting pipeline for Krea 2: such requests are refused naming what it serves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import SimpleNamespace

from diffusers import Krea2Pipeline

from engine.families.bfl_parts import SIZE_BUCKETS
from engine.families.krea2_names import convert_lora, lycoris_modules
from engine.families.krea2_tiny import TINY_WIDTH, build_tiny_pipeline
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
from engine.families.wan_vae_parts import LATENT_RGB
from engine.requests import CheckedRequest
from engine.storage import LinearSizes
from families.krea2 import IDENTITY, RAW_GUIDANCE, RAW_STEPS, TURBO_GUIDANCE, TURBO_STEPS

__all__ = ["FAMILY", "LATENT_RGB", "MEMORY", "WIDTHS", "convert_lora", "rules_out", "unpack_latents"]

# Parameter and buffer values as diffusers and transformers build them from the published configs (transformer/:
# Krea2Transformer2DModel's defaults, 28 blocks 6144 wide; text_encoder/: Qwen3-VL-4B-Instruct, its vision tower
# included; vae/: Qwen-Image's): 17.38 billion, 34.8 GB in bf16. Qwen3-VL is never adapted and may run from host
# RAM: with it there, the transformer's 25.6 GB need a 32 GB GPU in bf16, or fp8/int4/GGUF storage on 24 GB.
MEMORY = MemorySpec(
    values=(
        ("transformer", 12_820_073_036),
        ("text_encoder", 4_437_815_968),
        ("vae", 126_892_531),
    ),
    host_components=("text_encoder",),
    # The shared modulation, 6144 to 6 x 6144.
    largest_values=226_492_416,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer.
    linears=LinearSizes(12_818_579_468, 1_876_033, 3_665_805),
)
# Krea 2 is 6144 wide (48 heads of 128); its tiny stand-in has a width of its own, as each tiny pipeline does. A
# LoRA of the diffusers attention names FLUX's and Qwen-Image's share is Krea 2's at these widths.
WIDTHS = frozenset({6144, TINY_WIDTH})
# The main blocks' attention inputs (not the text-fusion blocks', which take Qwen3-VL's 2560), in each naming.
_HIDDEN_INPUT = re.compile(r"(^|\.|_unet_)(transformer_)?blocks[._]\d+[._]attn[._](to_[qkv]|w[qkv]|qkv)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight")
_UP = (".lora_up.weight", ".lora_b.weight")
# Its key and value projections (grouped-query: a quarter of the hidden width wide, never square).
_KEY_VALUE = re.compile(r"blocks[._]\d+[._]attn[._](to_[kv]|w[kv])$")


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its main blocks' attention factors take (Krea 2 LoRAs have no text encoder part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width; no text encoder is adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def rules_out(shapes: Shapes) -> bool:
    """A key or value projection as wide out as in: Krea 2's attend over fewer key/value heads than query heads."""
    lowered = {name.lower(): shape for name, shape in shapes.items()}
    for name, shape in lowered.items():
        if not name.endswith(_DOWN) or len(shape) < 2:
            continue
        stem = name[: name.rindex(".lora")]
        up = next((lowered[stem + u] for u in _UP if stem + u in lowered), None)
        if _KEY_VALUE.search(stem) and up is not None and len(up) >= 2 and up[0] == shape[1]:
            return True
    return False


def served_side(pipe: Pipeline) -> int:
    """Krea2Pipeline's default side, 1024; a tiny VAE's config states its own (`sample_size`)."""
    stated = getattr(pipe.vae.config, "sample_size", None)
    return int(stated) if stated else 1024


def defaults(pipe: Pipeline) -> RunDefaults:
    """A distilled pipeline (Turbo's `is_distilled`): 8 steps without guidance, as krea-ai/krea-2's README runs it;
    else Krea2Pipeline's 28 steps at 4.5 (Raw's). Its CFG reads the negative prompt; sides in the VAE's scale times
    the 2x2 patches."""
    steps, guidance = (TURBO_STEPS, TURBO_GUIDANCE) if pipe.config.is_distilled else (RAW_STEPS, RAW_GUIDANCE)
    multiple = int(pipe.patch_size) * int(pipe.vae_scale_factor)
    return RunDefaults(steps, guidance, "cfg", negative_prompt=True, side_multiple=multiple)


def call_arguments(request: CheckedRequest) -> dict[str, object]:
    """Krea2Pipeline's call: guidance above 0 runs CFG (`cond + g * (cond - uncond)`), which reads the negative
    prompt; at 0 one pass a step and no negative prompt."""
    return {
        "prompt": request.prompt,
        "negative_prompt": (request.negative_prompt or None) if request.guidance > 0 else None,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


def unpack_latents(latents: Tensor, height: int, width: int, vae_scale_factor: int) -> Tensor:
    """The packed latents (2x2 patches) as one spatial frame, by diffusers' own unpacking."""
    layout = SimpleNamespace(patch_size=2, vae_scale_factor=vae_scale_factor)
    return Krea2Pipeline._unpack_latents(layout, latents, height, width)[:, :, 0]


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=Krea2Pipeline,
    denoiser="transformer",
    components=("transformer",),
    side=1024,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths, rules_out, widths=WIDTHS),
    preview=PreviewSpec(None, LATENT_RGB, unpack=unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    lycoris_modules=lycoris_modules,
)
