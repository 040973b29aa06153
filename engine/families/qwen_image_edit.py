"""Qwen-Image-Edit: `QwenImageEditPipeline`, Qwen-Image's transformer reading an input image's latents beside the
output's, with Qwen2.5-VL seeing the image too, so every request brings an image (the prompt is the
instruction). Everything but the pipeline class, the identity, the processor and the tiny builder is Qwen-Image's
(`engine.families.qwen_image`): its LoRA namings and converter (the same `QwenImageLoraLoaderMixin`), widths,
defaults (50 steps, true CFG 4, as Qwen's card runs the edit), sizes, previews and memory (the same transformer,
encoder and VAE; the processor holds no weights). Inpainting is diffusers' `QwenImageEditInpaintPipeline` over
the same components. diffusers scales the input image to about 1 MP before encoding it, as the model was
trained; the output is the request's size.

Routing: Qwen-Image-Edit LoRAs have Qwen-Image's tensor names and shapes, so only what they declare brings them
here (a card's `base_model` Qwen/Qwen-Image-Edit, musubi-tuner's "Qwen-Image-Edit" metadata). One that
declares nothing is judged a Qwen-Image LoRA and goes to a Qwen-Image pool, as a FLUX.1 LoRA does beside FLUX.1
Kontext: a generation LoRA is the likelier reading of a bare file, and it runs there without an image. The 2509
and 2511 releases (`QwenImageEditPlusPipeline`, several reference images) are their own family and pool
(`engine.families.qwen_image_edit_plus`); their LoRAs fit this transformer too (the same keys and shapes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    QwenImageEditInpaintPipeline,
    QwenImageEditPipeline,
)

# ProcessorMixin: saved tiny pipelines name this module as their processor's library, and diffusers'
# `from_pretrained` checks a processor it is handed against the loadable base class it finds there by name.
from transformers import ProcessorMixin, Qwen2VLProcessor  # noqa: F401
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from engine.errors import SettingsError
from engine.families import qwen_image, tiny_qwen_image
from engine.families.spec import LoraSignature
from engine.families.tiny import TINY_SIDE
from families.qwen_image_edit import IDENTITY

__all__ = ["FAMILY", "ImageQwen2VLProcessor", "build_tiny_pipeline", "load_components"]

# The tiny edit transformer's width: 2 heads of 48, a width no other tiny pipeline has (the tiny Qwen-Image's is
# 72, the tiny FLUX.2 [dev]'s 88), so a LoRA's shapes tell the two tiny Qwen pools apart (the real ones share
# their widths: there cards decide).
TINY_WIDTH = 96
# The tiny processor's image sizes for Qwen2.5-VL's vision tower (pixels; a 112 px square at most, 16 image
# tokens), where Qwen's reaches 12.8 M: diffusers hands it the 1 MP conditioning image.
_TINY_PIXELS = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}


class ImageQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` for images and text only: it declares no video processor.

    transformers 5.24 derives a processor's parts from its `__init__` parameters, and builds or loads the video
    processor with torchvision, which this project does not install (PyPI's torchvision wheels do not import
    beside the CPU build of torch 2.13 these machines run). QwenImageEditPipeline never passes videos; without
    the parameter, `Qwen2VLProcessor.__init__` hands `ProcessorMixin` a video processor it drops, and loading
    reads the image processor (the PIL one where torchvision is absent) and the tokenizer only."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)


def load_components(model_id: str, token: str | None) -> Mapping[str, Any]:
    """The checkpoint's `processor/` read as an images-and-text processor (see `ImageQwen2VLProcessor`), after
    checking it is a QwenImageEditPipeline checkpoint (`processor_components`)."""
    return processor_components(model_id, token, QwenImageEditPipeline, IDENTITY.model_id)


def processor_components(model_id: str, token: str | None, pipeline_class: Any, reference: str) -> Mapping[str, Any]:
    """The processor of a checkpoint made for `pipeline_class` (Qwen-Image-Edit's, or the 2509/2511 releases'
    `QwenImageEditPlusPipeline`: `engine.families.qwen_image_edit_plus`).

    A checkpoint made for another pipeline is refused first: each has its own prompt template and conditioning,
    which the other class would load and run without a word; the refusal names the base that serves it."""
    named = pipeline_class.load_config(model_id, token=token).get("_class_name")
    if named not in (None, pipeline_class.__name__):
        served = _SERVED_BY.get(named)
        where = f"; a {named} checkpoint is served as BASE={served}" if served else ""
        raise SettingsError(
            f"{model_id} is a {named} checkpoint, which this pool does not run; accepted: a "
            f"{pipeline_class.__name__} checkpoint ({reference} or a fine-tune of it){where}"
        )
    return {"processor": ImageQwen2VLProcessor.from_pretrained(model_id, subfolder="processor", token=token)}


# The base each edit pipeline class is served as (a checkpoint named for the other pool's class says where).
_SERVED_BY = {
    "QwenImageEditPipeline": IDENTITY.model_id,
    "QwenImageEditPlusPipeline": "Qwen/Qwen-Image-Edit-2509 (or Qwen/Qwen-Image-Edit-2511)",
}


def build_tiny_pipeline(seed: int = 0) -> QwenImageEditPipeline:
    """A tiny Qwen-Image-Edit: the tiny Qwen-Image's Qwen2.5-VL encoder (its one-block vision tower reads the
    processor's pixel values), tokenizer and scheduler; a transformer of Qwen-Image's structure 96 wide; and a VAE
    of the real one's 8x downsampling (the tiny Qwen-Image's is 4x): diffusers always encodes the input image at
    about 1 MP, and with the 4x VAE its mid-block's attention over 256 x 256 latent pixels took 3.8 s of a
    2-step edit's 7.5 s (one profiled run on 2 CPU cores), and its latents made 16 k transformer tokens, where
    the 8x VAE's make 4 k. The tiny tokenizer spells the edit template's system turn in 169 tokens where Qwen's
    spells it in the 64 the pipeline drops, so the rest of it conditions tiny edits too (diffusers' and ours
    alike). The same seed gives the same weights."""
    made: Any = tiny_qwen_image.build_tiny_pipeline(seed)
    torch.manual_seed(seed + 5)
    transformer = tiny_qwen_image.tiny_qwen_transformer(TINY_WIDTH, axes_dims_rope=(8, 20, 20))
    torch.manual_seed(seed + 6)
    vae: Any = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    vae.register_to_config(sample_size=TINY_SIDE)
    processor = ImageQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(size=_TINY_PIXELS), tokenizer=made.tokenizer
    )
    components = {**made.components, "transformer": transformer, "vae": vae}
    pipe: Any = QwenImageEditPipeline(**components, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe


FAMILY = dataclasses.replace(
    qwen_image.FAMILY,
    identity=IDENTITY,
    pipeline_class=QwenImageEditPipeline,
    signature=LoraSignature(qwen_image.lora_widths, qwen_image.pipeline_widths),
    build_tiny=build_tiny_pipeline,
    image_to_image=None,
    inpainting=QwenImageEditInpaintPipeline,
    needs_image=True,
    load_components=load_components,
)
