"""What the UNet families share (SDXL, SD 1.x, SD 2.x): UNet and CLIP names, where widths show, how their
pipelines are called, their default side, and their LoRA conversion.

A LoRA's down factor (`lora_down`/`lora_A`) has the input width of the weight it changes as its second
dimension. The cross-attention keys and values (`attn2.to_k`/`to_v`) take the text embeddings, so their width
is the family's cross-attention width (SDXL 2048, SD 1.x 768, SD 2.x 1024); a text encoder's `q_proj` takes
its hidden states (CLIP-L 768, OpenCLIP-G 1280, OpenCLIP-H 1024). Together they tell every UNet family apart,
and the tiny pipelines too (each has widths of its own). A family of another architecture declares its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.families.spec import LoraConverter, Module, Pipeline, PipelineClass, Shapes, Tensor, Widths
from engine.requests import CheckedRequest

__all__ = [
    "SPEED_SCHEDULERS",
    "call_arguments",
    "converter",
    "lora_widths",
    "pipeline_widths",
    "served_side",
]

# Schedulers beyond their pipelines' `scheduler.compatibles` that the UNet families run: the speed LoRAs' own
# (diffusers' LCM-LoRA and TCD guides set them on SD 1.5 and SDXL pipelines with `from_config`).
SPEED_SCHEDULERS = ("LCMScheduler", "TCDScheduler")

# Compared lower-cased.
_DOWN = (".lora_down.weight", ".lora_a.weight", ".down.weight", "_lora.down.weight")
_TEXT_PREFIXES = ("lora_te", "text_encoder", "te.", "te1.", "te2.")


def lora_widths(shapes: Shapes) -> Widths:
    """The cross-attention and text-encoder widths a LoRA's down factors were made for."""
    cross, text = set(), set()
    for name, shape in shapes.items():
        lowered = name.lower()
        if not lowered.endswith(_DOWN) or len(shape) < 2:
            continue
        if "attn2" in lowered and ("to_k" in lowered or "to_v" in lowered):
            cross.add(int(shape[1]))
        elif lowered.startswith(_TEXT_PREFIXES) and "q_proj" in lowered:
            text.add(int(shape[1]))
    return Widths(frozenset(cross), frozenset(text))


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The same widths of a served pipeline: its UNet's cross-attention width, its text encoders' hidden sizes."""
    cross = denoiser.config.cross_attention_dim
    text = frozenset(int(encoder.config.hidden_size) for encoder in encoders.values())
    return Widths(frozenset(cross if isinstance(cross, list | tuple) else (cross,)), text)


def served_side(pipe: Pipeline) -> int:
    """The side a UNet pipeline makes by default, as diffusers' own pipelines compute it."""
    return int(pipe.unet.config.sample_size) * int(pipe.vae_scale_factor)


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """The Stable Diffusion pipelines' call: classifier-free guidance, with the negative prompt."""
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt or None,
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "width": request.width,
        "height": request.height,
    }


def converter(pipeline_class: PipelineClass) -> LoraConverter:
    """diffusers' `lora_state_dict` of `pipeline_class`, which reads SGM block names from the UNet's config."""

    def convert(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any]]:
        converted, alphas = pipeline_class.lora_state_dict(state_dict, unet_config=denoiser.config)
        return converted, alphas

    return convert
