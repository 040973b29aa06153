"""The diffusers ways of changing LoRA per request, on a pipeline whose denoiser is the one benchmarked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

from engine.families.sdxl import build_tiny_pipeline

from .measure import Clock

__all__ = ["CycleTimes", "hotswap_times", "reference_cycle", "reference_pipeline"]


@dataclass(frozen=True)
class CycleTimes:
    """Milliseconds of each phase of one reference request's LoRA handling."""

    load: float
    fuse: float
    unfuse: float
    unload: float

    @property
    def total(self) -> float:
        return self.load + self.fuse + self.unfuse + self.unload


def reference_pipeline(unet: UNet2DConditionModel) -> StableDiffusionXLPipeline:
    """An SDXL pipeline around `unet`; the other parts are tiny, since the LoRAs only touch the UNet."""
    tiny = build_tiny_pipeline()
    pipe = StableDiffusionXLPipeline(
        vae=tiny.vae,
        text_encoder=tiny.text_encoder,
        text_encoder_2=tiny.text_encoder_2,
        tokenizer=tiny.tokenizer,
        tokenizer_2=tiny.tokenizer_2,
        unet=unet,
        scheduler=tiny.scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_cycle(pipe: Any, path: Path, name: str, clock: Clock) -> CycleTimes:
    """One request of the reference service: load the file, fuse it, and after generating, take it out again
    (an SDXL or a FLUX pipeline: its LoRAs adapt the denoiser only, which `fuse_lora` fuses by default)."""
    started = clock()
    pipe.load_lora_weights(str(path.parent), weight_name=path.name, adapter_name=name)
    loaded = clock()
    pipe.fuse_lora(lora_scale=1.0)
    fused = clock()
    pipe.unfuse_lora()
    unfused = clock()
    pipe.unload_lora_weights()
    unloaded = clock()
    return CycleTimes(
        (loaded - started) * 1000, (fused - loaded) * 1000, (unfused - fused) * 1000, (unloaded - unfused) * 1000
    )


def hotswap_times(pipe: Any, paths: Sequence[Path], *, rank: int, repeats: int, clock: Clock) -> list[float]:
    """Milliseconds to hot-swap one unfused adapter for another, as diffusers documents it.

    `enable_lora_hotswap` must come before the first adapter is loaded; every later
    load names that adapter and passes `hotswap=True`.
    """
    pipe.enable_lora_hotswap(target_rank=rank)
    first = paths[0]
    pipe.load_lora_weights(str(first.parent), weight_name=first.name, adapter_name="hot")
    samples = []
    try:
        for index in range(1, repeats + 1):
            path = paths[index % len(paths)]
            started = clock()
            pipe.load_lora_weights(str(path.parent), weight_name=path.name, adapter_name="hot", hotswap=True)
            samples.append((clock() - started) * 1000)
    finally:
        pipe.unload_lora_weights()
    return samples
