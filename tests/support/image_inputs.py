"""Input images for the image-to-image and inpainting tests: made here (a gradient with noise, a half mask), and
diffusers' own reference for each mode (the mode's class `from_pipe` of a fresh pipeline with the LoRA fused)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.images import InputImage

PROMPT = "a photo of a fox in sks style"


def example_image(width: int = 64, height: int = 64, seed: int = 0) -> Image.Image:
    """A colour gradient with noise: enough structure that strength visibly matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    noisy = base + rng.normal(0, 20, base.shape)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB")


def example_mask(width: int = 64, height: int = 64) -> Image.Image:
    """White (repainted) on the right half, black (kept) on the left."""
    mask = np.zeros((height, width), np.uint8)
    mask[:, width // 2 :] = 255
    return Image.fromarray(mask, "L")


def input_image(width: int = 64, height: int = 64, seed: int = 0) -> InputImage:
    return InputImage.from_pil(example_image(width, height, seed))


def input_mask(width: int = 64, height: int = 64) -> InputImage:
    return InputImage.from_pil(example_mask(width, height), "L")


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def mode_reference(
    base_class: Any,
    mode_class: Any,
    tiny_dir: Path,
    folder: Path,
    weight_name: str,
    *,
    components: Sequence[str] | None = None,
    load: dict[str, Any] | None = None,
    **call: Any,
) -> Image.Image:
    """diffusers' own image: `base_class` from `tiny_dir`, the LoRA loaded and fused (`components`: those fused,
    diffusers' default when None), then `mode_class.from_pipe` of it called with `call` and seed 7."""
    pipe = base_class.from_pretrained(tiny_dir, **(load or {}))
    pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
    if components is None:
        pipe.fuse_lora()
    else:
        pipe.fuse_lora(components=list(components))
    mode = mode_class.from_pipe(pipe)
    mode.set_progress_bar_config(disable=True)
    return mode(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(7), **call).images[0]


def storages(pipe: Any) -> dict[int, int]:
    """Every distinct tensor storage the pipeline's models (or one model) hold: its address and bytes."""
    seen: dict[int, int] = {}
    modules = [pipe] if isinstance(pipe, torch.nn.Module) else pipe.components.values()
    for module in modules:
        if isinstance(module, torch.nn.Module):
            for tensor in (*module.parameters(), *module.buffers()):
                storage = tensor.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return seen


def resident_bytes(pipe: Any) -> int:
    """The bytes of every distinct tensor storage the pipeline's models hold."""
    return sum(storages(pipe).values())
