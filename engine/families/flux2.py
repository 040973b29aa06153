"""FLUX.2 [klein] (4B and 9B, distilled and base): `Flux2KleinPipeline`, a DiT with a Qwen3 text encoder, 1024 px.

A LoRA adapts the transformer only (never Qwen3, as diffusers' loader); every naming diffusers'
`Flux2LoraLoaderMixin.lora_state_dict` reads (diffusers/PEFT, ai-toolkit's BFL names with `lora_A`, its expanded
block names, PEFT's `base_model.model.`, kohya's `lora_unet_`) is converted by it; ComfyUI's BFL names with
`lora_down`/`.alpha`, which diffusers hands its kohya converter and drops, are renamed to ai-toolkit's first, and
a kohya layer diffusers would drop silently (FLUX.1's modulations, CLIP) is refused naming it (`convert_lora`).
FLUX.1's LoRAs share many names; their MLP widths tell them apart (`bfl_blocks`). The distilled models run 4
steps without guidance, the base ones 50 at a CFG of 4 (the transformer's config and the pipeline's
`is_distilled` say which); no negative prompt (the pipeline's CFG uses ""); sides in 16s; previews project the
packed 128-channel latents (ComfyUI's factors). A request with an image is a reference edit on the pool's own
pipeline (`Flux2KleinPipeline`'s `image=[...]`: references, not a starting point; diffusers 0.42 has no klein
image-to-image class): the image and up to 3 further `images`, BFL's limit of 4 for klein. Inpainting is
diffusers' `Flux2KleinInpaintPipeline` over the same components, which takes the further images as its
`image_reference`. The reasoning and sources: docs/internals.md.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from diffusers import Flux2KleinInpaintPipeline, Flux2KleinPipeline
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

from engine.errors import IncompatibleLoraError
from engine.families.bfl_blocks import FLUX2_RATIOS, contradicts
from engine.families.bfl_parts import SIZE_BUCKETS
from engine.families.flux2_tiny import build_tiny_pipeline
from engine.families.spec import (
    FamilySpec,
    LatentProjection,
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
from engine.references import ReferenceFit
from engine.requests import CheckedRequest
from families.flux2 import BASE_9B, IDENTITY, MODEL_ID_9B

__all__ = ["FAMILY", "LATENT_RGB", "MEMORY", "MEMORY_9B", "convert_lora", "lora_widths", "rules_out", "unpack_latents"]

# ComfyUI, comfy/latent_formats.py, class Flux2 (latent_rgb_factors and bias): one row per VAE channel, fitted on
# the transformer's latents (batch-normalised, 2x2 patches folded back: `unpack_latents`).
LATENT_RGB = LatentProjection(
    weights=(
        (0.0058, 0.0113, 0.0073), (0.0495, 0.0443, 0.0836), (-0.0099, 0.0096, 0.0644), (0.2144, 0.3009, 0.3652),
        (0.0166, -0.0039, -0.0054), (0.0157, 0.0103, -0.0160), (-0.0398, 0.0902, -0.0235), (-0.0052, 0.0095, 0.0109),
        (-0.3527, -0.2712, -0.1666), (-0.0301, -0.0356, -0.0180), (-0.0107, 0.0078, 0.0013), (0.0746, 0.0090, -0.0941),
        (0.0156, 0.0169, 0.0070), (-0.0034, -0.0040, -0.0114), (0.0032, 0.0181, 0.0080), (-0.0939, -0.0008, 0.0186),
        (0.0018, 0.0043, 0.0104), (0.0284, 0.0056, -0.0127), (-0.0024, -0.0022, -0.0030), (0.1207, -0.0026, 0.0065),
        (0.0128, 0.0101, 0.0142), (0.0137, -0.0072, -0.0007), (0.0095, 0.0092, -0.0059), (0.0000, -0.0077, -0.0049),
        (-0.0465, -0.0204, -0.0312), (0.0095, 0.0012, -0.0066), (0.0290, -0.0034, 0.0025), (0.0220, 0.0169, -0.0048),
        (-0.0332, -0.0457, -0.0468), (-0.0085, 0.0389, 0.0609), (-0.0076, 0.0003, -0.0043), (-0.0111, -0.0460, -0.0614),
    ),
    bias=(-0.0329, -0.0718, -0.0851),
)  # fmt: skip
# Parameter and buffer values as diffusers and transformers build them from each model's configs (transformer/,
# text_encoder/ Qwen3ForCausalLM, vae/ AutoencoderKLFlux2), checked on the meta device
# (tests/engine/pools/test_plan_flux2.py). Qwen3 is never adapted and may run from host RAM (token ids in,
# embeddings out). klein 4B: 5 double and 20 single blocks 3072 wide, Qwen3-4B (tied embeddings).
MEMORY = MemorySpec(
    values=(
        ("transformer", 3_875_544_576),
        ("text_encoder", 4_022_468_224),
        ("vae", 84_046_372),
    ),
    host_components=("text_encoder",),
    # Each single block's fused projection, 3072 to q, k, v and the SwiGLU's input (9 x 3072).
    largest_values=84_934_656,
)
# klein 9B: 8 double and 24 single blocks 4096 wide, Qwen3-8B.
MEMORY_9B = MemorySpec(
    values=(
        ("transformer", 9_078_581_248),
        ("text_encoder", 8_190_735_488),
        ("vae", 84_046_372),
    ),
    host_components=("text_encoder",),
    largest_values=150_994_944,
)
# The attention inputs a LoRA's down factor shows the hidden width on (q/k/v alone or fused, with the MLP).
# FLUX.2's call scales a reference image over this many pixels down to it (diffusers: `1024 * 1024`, inline).
REFERENCE_AREA = 1024 * 1024

_HIDDEN_INPUT = re.compile(r"(to_[qkv]|add_[qkv]_proj|qkv|linear1|to_qkv_mlp_proj)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight")
# Every kohya stem diffusers' FLUX.2 converter reads (`_convert_kohya_flux2_lora_to_diffusers`); it warns about
# the rest and drops them, so a file holding others (FLUX.1's modulations, its CLIP part) is refused here.
_KOHYA_STEM = re.compile(
    r"^lora_unet_(double_blocks_\d+_(img|txt)_(attn_(proj|qkv)|mlp_[02])|single_blocks_\d+_linear[12]"
    r"|img_in|txt_in|time_in_(in|out)_layer|final_layer_linear)\.(lora_down\.weight|lora_up\.weight|alpha)$"
)
_COMFY = re.compile(r"^(diffusion_model\..+)\.(lora_down|lora_up)\.weight$")


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its transformer factors take (FLUX.2 LoRAs have no text encoder part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width; no text encoder is adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def rules_out(shapes: Shapes) -> bool:
    """Another architecture's MLP ratios (FLUX.1's, in the blocks whose names FLUX.2 kept)."""
    return contradicts(FLUX2_RATIOS, shapes)


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`Flux2KleinPipeline.lora_state_dict`), after two checks of what it would lose.

    diffusers sends every file holding a `.lora_down.weight` to its kohya converter, which reads only kohya's
    `lora_unet_` stems: a kohya layer outside them is refused here naming it (diffusers warns and drops it), and
    ComfyUI's `diffusion_model.` names with `lora_down`/`lora_up` (all dropped by diffusers: #13162's "No LoRA
    keys") are renamed to ai-toolkit's `lora_A`/`lora_B`, each `.alpha` folded into its down factor (alpha/rank,
    as kohya's converter scales), which its ai-toolkit converter reads. Kohya's alphas are folded by diffusers.
    What it cannot read comes out as a ValueError (as every family's converter reports it)."""
    if any(name.endswith(".lora_down.weight") for name in state_dict):
        if any(name.startswith("lora_unet_") for name in state_dict):
            _refuse_dropped(state_dict)
        else:
            state_dict = _comfy_to_ai_toolkit(state_dict)
    try:
        converted = Flux2KleinPipeline.lora_state_dict(dict(state_dict))
    except (AssertionError, RuntimeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"diffusers' FLUX.2 converter could not read it ({type(e).__name__}: {e})") from e
    return converted, None


def _refuse_dropped(state_dict: Mapping[str, Tensor]) -> None:
    dropped = sorted(name for name in state_dict if not _KOHYA_STEM.match(name))
    if dropped:
        raise IncompatibleLoraError(
            f"its kohya layers {', '.join(dropped[:5])} are none of FLUX.2's (a FLUX.1 LoRA's modulations or CLIP "
            "part?); accepted: kohya's FLUX.2 blocks (double_blocks img/txt attn and mlp, single_blocks linear1/2)"
        )


def _comfy_to_ai_toolkit(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    renamed: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        match = _COMFY.match(name)
        if match is None:
            if not name.endswith(".alpha"):
                renamed[name] = tensor
            continue
        stem, part = match[1], match[2]
        if part == "lora_down":
            alpha = state_dict.get(f"{stem}.alpha")
            scale = float(alpha) / tensor.shape[0] if alpha is not None else 1.0
            renamed[f"{stem}.lora_A.weight"] = tensor * scale if scale != 1.0 else tensor
        else:
            renamed[f"{stem}.lora_B.weight"] = tensor
    return renamed


def unpack_latents(latents: Tensor, height: int, width: int, vae_scale_factor: int) -> Tensor:
    """Flux2KleinPipeline's per-step tokens (batch, h x w, 128), row-major over the 2x2-patched latent grid, as the
    VAE's 32 channels at twice the grid (diffusers' `_unpatchify_latents`, still batch-normalised)."""
    rows, columns = height // (vae_scale_factor * 2), width // (vae_scale_factor * 2)
    batch, _, channels = latents.shape
    grid = latents.permute(0, 2, 1).reshape(batch, channels, rows, columns)
    return Flux2KleinPipeline._unpatchify_latents(grid)


def served_side(pipe: Pipeline) -> int:
    """Flux2KleinPipeline's default side is 1024 (its default latent size times the VAE's scale), which the VAE's
    config states as `sample_size` (a tiny VAE states its own)."""
    return int(pipe.vae.config.sample_size)


def defaults(pipe: Pipeline) -> RunDefaults:
    """The distilled models (`is_distilled`, klein 4B and 9B) take 4 steps and no guidance; the base ones 50 steps
    at a CFG of 4, whose negative side is the pipeline's own empty prompt. Sides go in the VAE's scale times the
    2x2 patches."""
    multiple = 2 * int(pipe.vae_scale_factor)
    fit = reference_fit(pipe)
    if pipe.config.is_distilled:
        return RunDefaults(4, 1.0, "none", negative_prompt=False, side_multiple=multiple, reference_fit=fit)
    return RunDefaults(50, 4.0, "cfg", negative_prompt=False, side_multiple=multiple, reference_fit=fit)


def reference_fit(pipe: Pipeline) -> ReferenceFit:
    """FLUX.2's call (klein's and [dev]'s) scales a reference over 1 MP down to it, then center-crops its sides to
    the VAE's scale times the 2x2 patches; it refuses a side under 64 or a ratio over 8 (`check_image_input`'s
    defaults, read from it). klein's inpainting reads every reference at the first reference's size."""
    checks = inspect.signature(Flux2ImageProcessor.check_image_input).parameters
    return ReferenceFit(
        REFERENCE_AREA,
        2 * int(pipe.vae_scale_factor),
        min_side=checks["min_side_length"].default,
        max_ratio=checks["max_aspect_ratio"].default,
        inpaint_first_size=True,
    )


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """Flux2KleinPipeline's call: no negative prompt (its CFG encodes ""), `guidance_scale` for the base models."""
    return {
        "prompt": request.prompt,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=Flux2KleinPipeline,
    denoiser="transformer",
    components=("transformer",),
    side=1024,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    # klein is trained around a megapixel on FLUX.1's aspect ratios.
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths, rules_out),
    # No distilled decoder of FLUX.2's VAE is published for diffusers' AutoencoderTiny: the projection.
    preview=PreviewSpec(None, LATENT_RGB, unpack=unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    # Its own pipeline edits from references (`image=[...]`): BFL's limit for klein 4B and 9B is 4 images.
    image_to_image=Flux2KleinPipeline,
    max_reference_images=4,
    inpainting=Flux2KleinInpaintPipeline,
    inpaint_references=True,
    # klein 4B's (the reference model's, and a fine-tune's of unknown size); the 9B bases declare their own.
    memory=MEMORY,
    base_memory=((MODEL_ID_9B, MEMORY_9B), (BASE_9B, MEMORY_9B)),
)
