"""Wan (2.1 text-to-video 1.3B and 14B, 2.2 TI2V-5B): `WanPipeline`, one video DiT with a UMT5 encoder and a causal
video VAE; a result is a video (`FamilySpec.video`: its frames, in order). A TI2V-5B pool also makes a video from
an image (image-to-video): diffusers' `WanImageToVideoPipeline` over the pool's own components, which with
`expand_timesteps` (TI2V-5B's config) takes the image as the first latent frame, at timestep 0, and needs no image
encoder. Wan 2.1's text-to-video models have no such input: their pools refuse an image (`pipeline_modes`).

A LoRA adapts the transformer only (never UMT5, as diffusers' loader); every naming diffusers'
`WanPipeline.lora_state_dict` reads (diffusers/PEFT, ComfyUI/ai-toolkit's `diffusion_model.` with `.alpha`,
kohya/musubi-tuner's `lora_unet_`) is converted by its own converter. Full differences (`full_differences`)
are added to their parameter at the LoRA's scale, `W + scale·diff`, as ComfyUI applies them: a `.diff` to a
weight (lightx2v's speed LoRAs' `cross_attn.norm_k_img.diff`, a norm's, a Linear's), a `.diff_b` to a bias, a
`.diff_m` (kijai's, lightx2v's) to a block's or the head's modulation, each parameter named by diffusers' own
Wan single-file converter (`blocks.N.modulation` -> `blocks.N.scale_shift_table`). diffusers' LoRA loader
applies only a Linear's `.diff_b` beside its factors (PEFT's `lora_B.bias`, the same sum) and drops the rest
with a log line; applying them is what the file's author meant. tests/engine/formats/test_full_differences.py.
Defaults as diffusers and Wan's card run it: 50 steps at CFG 5, 81 frames (4k+1, capped by MAX_VIDEO_FRAMES) at
16 fps (TI2V-5B: 24), sides in the VAE's scale times the 2x2 patches. Previews: a strip of a few latent frames
side by side through Wan 2.1's latent projection (TI2V-5B's 48-channel latents through Wan 2.2's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from diffusers import WanImageToVideoPipeline, WanPipeline
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

from engine.families.spec import (
    FamilySpec,
    LatentProjection,
    LoraSignature,
    Module,
    Pipeline,
    PreviewSpec,
    RunDefaults,
    Shapes,
    Tensor,
    VideoDefaults,
    Widths,
    head_width,
    hidden_widths,
)
from engine.families.tiny_wan import TINY_FRAMES, build_tiny_pipeline
from engine.families.wan_memory import MEMORY_1_3B, MEMORY_5B, MEMORY_14B
from engine.families.wan_vae_parts import LATENT_RGB
from engine.requests import CheckedRequest, RequestMode
from families.wan import IDENTITY, MODEL_ID_5B, MODEL_ID_14B

__all__ = [
    "FAMILY",
    "LATENT_RGB",
    "LATENT_RGB_5B",
    "PREVIEW_FRAMES",
    "convert_lora",
    "full_differences",
    "unpack_latents",
]

# Wan's 480P sizes (832 x 480 both ways) and the square between them, at the 480 side.
SIDE = 480
SIZE_BUCKETS = ((832, 480), (480, 832), (624, 624))
# Wan's own frames: 81 (5 s at 16 fps) for 2.1, 121 at 24 fps for TI2V-5B; MAX_VIDEO_FRAMES caps both.
_FRAMES = {False: (81, 16), True: (121, 24)}
# Wan 2.2 TI2V-5B's 48-channel latents (its own VAE, 16x spatially): ComfyUI's comfy/latent_formats.py, class
# Wan22 (Comfy-Org/ComfyUI at 75399d78, latent_rgb_factors and latent_rgb_factors_bias), fitted on its normalised
# latents as Wan21's are.
LATENT_RGB_5B = LatentProjection(
    weights=(
        (0.0119, 0.0103, 0.0046),
        (-0.1062, -0.0504, 0.0165),
        (0.0140, 0.0409, 0.0491),
        (-0.0813, -0.0677, 0.0607),
        (0.0656, 0.0851, 0.0808),
        (0.0264, 0.0463, 0.0912),
        (0.0295, 0.0326, 0.0590),
        (-0.0244, -0.0270, 0.0025),
        (0.0443, -0.0102, 0.0288),
        (-0.0465, -0.0090, -0.0205),
        (0.0359, 0.0236, 0.0082),
        (-0.0776, 0.0854, 0.1048),
        (0.0564, 0.0264, 0.0561),
        (0.0006, 0.0594, 0.0418),
        (-0.0319, -0.0542, -0.0637),
        (-0.0268, 0.0024, 0.0260),
        (0.0539, 0.0265, 0.0358),
        (-0.0359, -0.0312, -0.0287),
        (-0.0285, -0.1032, -0.1237),
        (0.1041, 0.0537, 0.0622),
        (-0.0086, -0.0374, -0.0051),
        (0.0390, 0.0670, 0.2863),
        (0.0069, 0.0144, 0.0082),
        (0.0006, -0.0167, 0.0079),
        (0.0313, -0.0574, -0.0232),
        (-0.1454, -0.0902, -0.0481),
        (0.0714, 0.0827, 0.0447),
        (-0.0304, -0.0574, -0.0196),
        (0.0401, 0.0384, 0.0204),
        (-0.0758, -0.0297, -0.0014),
        (0.0568, 0.1307, 0.1372),
        (-0.0055, -0.0310, -0.0380),
        (0.0239, -0.0305, 0.0325),
        (-0.0663, -0.0673, -0.0140),
        (-0.0416, -0.0047, -0.0023),
        (0.0166, 0.0112, -0.0093),
        (-0.0211, 0.0011, 0.0331),
        (0.1833, 0.1466, 0.2250),
        (-0.0368, 0.0370, 0.0295),
        (-0.3441, -0.3543, -0.2008),
        (-0.0479, -0.0489, -0.0420),
        (-0.0660, -0.0153, 0.0800),
        (-0.0101, 0.0068, 0.0156),
        (-0.0690, -0.0452, -0.0927),
        (-0.0145, 0.0041, 0.0015),
        (0.0421, 0.0451, 0.0373),
        (0.0504, -0.0483, -0.0356),
        (-0.0837, 0.0168, 0.0055),
    ),
    bias=(0.0317, -0.0878, -0.1388),
)
# The latent frames a preview strip shows (81 frames are 21 latent frames: 4 of them, about 1.3 s apart at 16 fps).
PREVIEW_FRAMES = 4
# The self- and cross-attention inputs a LoRA's down factor shows the hidden width on (diffusers' `attn1`/`attn2`
# q, k and v; the original `self_attn`/`cross_attn` q; kohya's underscores).
_HIDDEN_INPUT = re.compile(r"(attn1[._]to[._][qkv]|attn2[._]to[._]q|self_attn[._][qkv]|cross_attn[._]q)[._]")
_DOWN = (".lora_down.weight", ".lora_a.weight", ".lora_a.default.weight")
# A full difference's suffix -> the parameter it changes (`.diff_m`: a block's `modulation`, as kijai's
# WanVideoWrapper renames it), in Wan's original names under ComfyUI's prefix.
_DIFFERENCE = re.compile(r"\.diff(_b|_m)?$")
_DIFFERENCE_OF = {".diff": ".weight", ".diff_b": ".bias", ".diff_m": ".modulation"}
_ORIGINAL = "diffusion_model."
# diffusers' converter reports what it cannot read with these (and ValueError, which passes as it is).
_CONVERTER_ERRORS = (AssertionError, RuntimeError, KeyError, TypeError, AttributeError, IndexError)


def lora_widths(shapes: Shapes) -> Widths:
    """The hidden width its attention factors take (Wan LoRAs have no text encoder part)."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's hidden width; UMT5 is never adapted."""
    return Widths(frozenset({head_width(denoiser)}))


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`WanPipeline.lora_state_dict`: `diffusion_model.` names, with their alphas
    folded into the factors, and musubi's `lora_unet_`; diffusers/PEFT names as they are). Given a copy (diffusers
    pops what it converts), without the file's full differences (`full_differences` places them). What diffusers
    cannot read comes out as a ValueError (as every family's converter reports it)."""
    try:
        return WanPipeline.lora_state_dict(dict(state_dict)), None
    except _CONVERTER_ERRORS as e:
        raise ValueError(f"diffusers' Wan converter could not read it ({type(e).__name__}: {e})") from e


def full_differences(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each full difference among `names` -> the transformer's parameter it is added to, in diffusers' names: Wan's
    original names (`diffusion_model.blocks.0.cross_attn.norm_k_img.diff`) through diffusers' single-file converter
    (`transformer.blocks.0.attn2.norm_added_k.weight`; `blocks.0.diff_m` is `blocks.0.modulation`'s, which it names
    `blocks.0.scale_shift_table`, `head.diff_m` the head's, `scale_shift_table`), diffusers' own (`transformer.`)
    as they are. Other namings (musubi's `lora_unet_`, which writes none) are left out."""
    placed: dict[str, tuple[str, ...]] = {}
    for name in names:
        match = _DIFFERENCE.search(name)
        if match is None:
            continue
        parameter = name[: match.start()] + _DIFFERENCE_OF[match.group()]
        if parameter.startswith(_ORIGINAL):
            original = parameter.removeprefix(_ORIGINAL)
            converted = convert_wan_transformer_to_diffusers({original: torch.empty(0)})
            placed[name] = tuple(f"transformer.{key}" for key in converted)
        elif parameter.startswith("transformer."):
            placed[name] = (parameter,)
    return placed


def served_side(pipe: Pipeline) -> int:
    """Wan's 480P side (TI2V-5B: 704, its 720P's short side); a tiny VAE's config states its own."""
    stated = getattr(pipe.vae.config, "sample_size", None)
    return int(stated) if stated else (704 if pipe.config.expand_timesteps else SIDE)


def defaults(pipe: Pipeline) -> RunDefaults:
    """diffusers' and the card's: 50 steps at CFG 5, which reads the negative prompt; sides in the VAE's spatial
    scale times the 2x2 patches."""
    return RunDefaults(50, 5.0, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor_spatial))


def video(pipe: Pipeline) -> VideoDefaults:
    """81 frames at 16 fps (TI2V-5B: 121 at 24); a tiny VAE's pipeline makes 5."""
    frames, fps = _FRAMES[bool(pipe.config.expand_timesteps)]
    if getattr(pipe.vae.config, "sample_size", None):
        frames = TINY_FRAMES
    return VideoDefaults(num_frames=frames, fps=fps, max_frames=frames if frames > 81 else 81)


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """WanPipeline's call; a request the engine makes itself (a warm-up) asks for one frame."""
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt or None,
        "guidance_scale": request.guidance,
        "num_inference_steps": request.steps,
        "width": request.width,
        "height": request.height,
        "num_frames": request.num_frames or 1,
    }


def pipeline_modes(pipe: Pipeline) -> tuple[RequestMode, ...]:
    """Text-to-video; image-to-video too where the model reads each latent frame's own timestep (TI2V-5B's
    `expand_timesteps`), the input diffusers' image-to-video call gives the image's frame."""
    image = ("image-to-image",) if pipe.config.get("expand_timesteps") else ()
    return ("text-to-image", *image)


def unpack_latents(latents: Tensor, height: int, width: int, vae_scale_factor: int) -> Tensor:
    """A strip of the (batch, channels, frames, height, width) latents' frames side by side: up to
    `PREVIEW_FRAMES` latent frames, evenly spaced from the first to the last (each stands for 4 video frames
    after the first), so the preview shows the motion forming, not one still."""
    count = latents.shape[2]
    shown = min(PREVIEW_FRAMES, count)
    picked = [round(i * (count - 1) / (shown - 1)) for i in range(shown)] if shown > 1 else [0]
    return torch.cat([latents[:, :, index] for index in picked], dim=-1)


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=WanPipeline,
    denoiser="transformer",
    components=("transformer",),
    side=SIDE,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths),
    preview=PreviewSpec(None, LATENT_RGB, unpack=unpack_latents, more_projections=(LATENT_RGB_5B,)),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    # Each base at its own size (`engine.families.wan_memory`); UMT5-XXL may run from host RAM.
    memory=MEMORY_1_3B,
    base_memory=((MODEL_ID_14B, MEMORY_14B), (MODEL_ID_5B, MEMORY_5B)),
    video=video,
    guidance_passes=2,
    denoiser_blocks="blocks",
    image_to_image=WanImageToVideoPipeline,
    pipeline_modes=pipeline_modes,
    full_differences=full_differences,
)
