"""Qwen-Image-Edit-2509 and -2511: `QwenImageEditPlusPipeline`, Qwen-Image-Edit's transformer, encoder and VAE
reading one to three reference images (the request's `image`, then its `images`: the prompt's "image 1", "image
2", ...), each seen by Qwen2.5-VL as "Picture N" at about 384 x 384 and encoded by the VAE at about 1 MP.

Built exactly as Qwen-Image-Edit is (`engine.families.qwen_image_edit`): its LoRA namings and converter, widths,
sizes, previews, memory (the same 20 B transformer: Qwen-Image-sized) and processor loading; only the pipeline
class, the identity (`families.qwen_image_edit_plus`), the reference limit (3, as Qwen's cards run them), the
defaults (40 steps at true CFG 4, Qwen's card) and the tiny builder differ. diffusers 0.42 has no inpainting class
for it, so a mask is refused naming what it serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE, VAE_IMAGE_SIZE

from engine.families import qwen_image, qwen_image_edit, tiny_qwen_image
from engine.families.spec import LoraSignature, Pipeline, RunDefaults
from engine.references import ReferenceFit
from families.qwen_image_edit_plus import IDENTITY

__all__ = ["FAMILY", "MAX_REFERENCES", "build_tiny_pipeline", "load_components"]

# The tiny transformer's width: 2 heads of 56 (the tiny Qwen-Image's is 72, the tiny Qwen-Image-Edit's 96).
TINY_WIDTH = 112
# Qwen's cards for 2509 and 2511: "multi-image editing", one to three images work best.
MAX_REFERENCES = 3


def load_components(model_id: str, token: str | None) -> Mapping[str, Any]:
    """The checkpoint's processor (as Qwen-Image-Edit's), after checking it is a QwenImageEditPlusPipeline one."""
    return qwen_image_edit.processor_components(model_id, token, QwenImageEditPlusPipeline, IDENTITY.model_id)


def build_tiny_pipeline(seed: int = 0) -> QwenImageEditPlusPipeline:
    """The tiny Qwen-Image-Edit's components (`qwen_image_edit.build_tiny_pipeline`: its 8x VAE, one-block vision
    tower, processor and encoder) with a transformer of Qwen-Image's structure 112 wide (each tiny pipeline has a
    width of its own, so a LoRA's shapes tell the tiny pools apart: the real ones share theirs, and cards decide)
    as a QwenImageEditPlusPipeline: 2509 and 2511 are Qwen-Image-Edit's architecture, further trained. The same
    seed gives the same weights."""
    edit: Any = qwen_image_edit.build_tiny_pipeline(seed)
    torch.manual_seed(seed + 7)
    transformer = tiny_qwen_image.tiny_qwen_transformer(TINY_WIDTH, axes_dims_rope=(8, 24, 24))
    pipe: Any = QwenImageEditPlusPipeline(**{**edit.components, "transformer": transformer})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def defaults(pipe: Pipeline) -> RunDefaults:
    """Qwen's card for 2509 and 2511: 40 steps at true CFG 4 (with " " as the negative prompt). Its call scales every
    image to about 1 MP for the VAE and about 384 x 384 for Qwen2.5-VL, sides in 32s (diffusers' own constants)."""
    fit = ReferenceFit(VAE_IMAGE_SIZE, 32, always=True, encoder_area=CONDITION_IMAGE_SIZE)
    return dataclasses.replace(qwen_image.defaults(pipe), steps=40, reference_fit=fit)


FAMILY = dataclasses.replace(
    qwen_image_edit.FAMILY,
    identity=IDENTITY,
    pipeline_class=QwenImageEditPlusPipeline,
    defaults=defaults,
    signature=LoraSignature(qwen_image.lora_widths, qwen_image.pipeline_widths),
    build_tiny=build_tiny_pipeline,
    inpainting=None,
    max_reference_images=MAX_REFERENCES,
    load_components=load_components,
)
