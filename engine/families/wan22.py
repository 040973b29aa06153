"""Wan 2.2 T2V-A14B: `WanPipeline` with two transformers, `transformer` for the high-noise steps and
`transformer_2` for the low-noise ones, switched at the pipeline's `boundary_ratio` (0.875 of the timesteps).

Both are LoRA components. A single LoRA file goes to both transformers, as diffusers loads it twice
(`load_lora_weights`, then again with `load_into_transformer_2=True`): at the request's `scale` on the high-noise
one and its `scale_2` on the low-noise one (`second_stage`; None: `scale` on both). Its names are Wan's, converted
by diffusers' own converter, its full differences placed on both (`engine.families.wan`). A high-noise/low-noise
pair of files is one LoRA (`engine.prepare.stages`, named as `lora_catalog.pairs` says).
Defaults as diffusers' A14B example runs it: 40 steps, CFG 4 for the high-noise stage and 3 for the low-noise one
(`guidance_2`), 81 frames at 16 fps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from diffusers import WanPipeline

from engine.families import wan
from engine.families.spec import (
    FamilySpec,
    LoraSignature,
    Module,
    Pipeline,
    PreviewSpec,
    RunDefaults,
    Tensor,
    VideoDefaults,
)
from engine.families.tiny_wan import build_tiny_a14b_pipeline
from engine.families.wan_memory import MEMORY_A14B
from engine.requests import CheckedRequest
from families.wan22 import IDENTITY
from lora_catalog.pairs import stage_in_name

__all__ = ["FAMILY", "convert_lora", "full_differences", "stage_of"]

_LOW = "transformer_2."
# A file's stage by its name in an explicit form (`lora_catalog.pairs`: `..._high_noise`, Wan2.2-Lightning's
# `high_noise_model.safetensors` and `..._HIGH_fp16`), else musubi-tuner's / kohya's metadata naming the model it
# was trained on ("wan22_low_noise"), by the same rule.
_STAGE_METADATA = ("ss_output_name", "modelspec.title", "ss_base_model_version")


def stage_of(file_name: str, metadata: Mapping[str, str]) -> int | None:
    """0 for a high-noise file, 1 for a low-noise one, by its name or else its metadata; None: both (or it says
    both, which cannot be)."""
    # The file's own name: a Hub pair's folder ("...-V1.1/high_noise_model.safetensors") says nothing of it.
    for text in (file_name.rsplit("/", 1)[-1], *(str(metadata.get(k, "")) for k in _STAGE_METADATA)):
        stage = stage_in_name(text)
        if stage is not None:
            return stage
    return None


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """Wan's conversion, and every factor for the high-noise transformer given again for the low-noise one."""
    converted, alphas = wan.convert_lora(state_dict, denoiser)
    low = {_LOW + name.removeprefix("transformer."): tensor for name, tensor in converted.items()}
    return {**converted, **low}, alphas


def full_differences(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Wan's placing, each full difference on both transformers (as diffusers loads a file into each)."""
    placed = wan.full_differences(names)
    return {name: (*at, *(_LOW + p.removeprefix("transformer.") for p in at)) for name, at in placed.items()}


def defaults(pipe: Pipeline) -> RunDefaults:
    """diffusers' A14B example: 40 steps at CFG 4 (the high-noise stage's)."""
    return RunDefaults(40, 4.0, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor_spatial))


def video(pipe: Pipeline) -> VideoDefaults:
    """Wan's frames, and the low-noise stage's guidance 3."""
    return VideoDefaults(**{**vars(wan.video(pipe)), "guidance_2": 3.0})


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """Wan's call with the low-noise stage's guidance (None: the high-noise stage's)."""
    return {**wan.call_arguments(request), "guidance_scale_2": request.guidance_2}


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=WanPipeline,
    denoiser="transformer",
    components=("transformer", "transformer_2"),
    side=wan.SIDE,
    served_side=wan.served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=wan.SIZE_BUCKETS,
    full_differences=full_differences,
    convert_lora=convert_lora,
    signature=LoraSignature(wan.lora_widths, wan.pipeline_widths),
    preview=PreviewSpec(None, wan.LATENT_RGB, unpack=wan.unpack_latents),
    build_tiny=build_tiny_a14b_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY_A14B,
    video=video,
    guidance_passes=2,
    denoiser_blocks="blocks",
    second_stage="transformer_2",
    stage_of=stage_of,
)
