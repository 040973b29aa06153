"""Live previews: the latents of a denoising step turned into a small RGB image, cheaply.

`TinyVaePreview` decodes with the family's tiny autoencoder (TAESDXL, TAESD, TAEF1) read only from a local
folder or the Hugging Face cache (`PREVIEW_VAE`), never downloaded while serving; otherwise `LinearPreview`
projects the latent channels to RGB with the family's fixed factors (ComfyUI's `latent_rgb_factors`). Packed
latents (FLUX's 2x2 patches) are unpacked first; sigma-scaled latents are brought back to unit variance as the
scheduler's `scale_model_input` does, so a preview fades from noise to the image. Details:
docs/internals.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from diffusers.image_processor import VaeImageProcessor
from PIL import Image

from engine.families.spec import FamilySpec, LatentProjection
from engine.settings import Settings
from lora_catalog.entries import Family

__all__ = [
    "LatentProjection",
    "LinearPreview",
    "PreviewDecoder",
    "StepPreviews",
    "TinyVaePreview",
    "load_preview_decoder",
]

logger = logging.getLogger(__name__)

# Stateless: only its config (normalise from [-1, 1], RGB) is used.
_PROCESSOR = VaeImageProcessor()


class PreviewDecoder(Protocol):
    """Latents of one step (batch first; the first image is shown) -> a preview image (None: none for these)."""

    name: str

    def __call__(self, latents: torch.Tensor, scheduler: object) -> Image.Image | None: ...


class LinearPreview:
    """The fixed per-family projection, at latent resolution: a (channels x 3) matmul, microseconds per row.

    A family whose bases differ in latent channels (Wan: 16, TI2V-5B's 48) gives a projection for each (`more`):
    the latents' channels pick one; latents no projection fits get no preview (None), the run goes on."""

    def __init__(self, projection: LatentProjection, family: Family, more: tuple[LatentProjection, ...] = ()) -> None:
        self.name = f"linear ({family.value})"
        self._by_channels = {
            len(p.weights): (torch.tensor(p.weights, dtype=torch.float32), torch.tensor(p.bias, dtype=torch.float32))
            for p in (*more, projection)
        }

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor, scheduler: object) -> Image.Image | None:
        latent = _unit_variance(latents[0], scheduler).float()
        found = self._by_channels.get(latent.shape[0])
        if found is None:
            return None
        weights, bias = found[0].to(latent.device), found[1].to(latent.device)
        rgb = torch.nn.functional.linear(latent.movedim(0, -1), weights.T, bias)
        return _to_image(rgb.movedim(-1, 0)[None])


class TinyVaePreview:
    """diffusers' AutoencoderTiny: a full-size preview from a decoder a few MB large."""

    def __init__(self, vae: torch.nn.Module, source: str) -> None:
        self.name = f"AutoencoderTiny ({source})"
        self._vae = vae
        # As a diffusers pipeline decodes with it as its VAE: latents / scaling_factor (+ shift_factor, FLUX's).
        config = getattr(vae, "config", None)
        self._scaling = float(getattr(config, "scaling_factor", 1.0) or 1.0)
        self._shift = float(getattr(config, "shift_factor", 0.0) or 0.0)
        self._channels = getattr(config, "latent_channels", None)

    @torch.inference_mode()
    def __call__(self, latents: torch.Tensor, scheduler: object) -> Image.Image | None:
        if self._channels is not None and latents.shape[1] != self._channels:
            # PREVIEW_VAE is one setting for every pool: a pool of other latents (Wan's 16 channels beside a
            # TAESD's 4) gets no preview rather than a failed step.
            return None
        weight = next(self._vae.parameters())
        latent = _unit_variance(latents[:1], scheduler) / self._scaling + self._shift
        return _to_image(self._vae.decode(latent.to(device=weight.device, dtype=weight.dtype)).sample)  # type: ignore[operator]


@dataclass(frozen=True)
class StepPreviews:
    """The per-step hook of one run: every `every` steps, decode the latents and hand the image on."""

    decoder: PreviewDecoder
    every: int
    steps: int
    send: Callable[[int, Image.Image], None]

    @classmethod
    def for_run(
        cls,
        decoder: PreviewDecoder | None,
        every: int,
        steps: int | None,
        send: Callable[[int, Image.Image], None] | None,
    ) -> StepPreviews | None:
        """None when previews are off or nobody asked for them (the HTTP endpoint, a comparison)."""
        if decoder is None or send is None or not steps:
            return None
        return cls(decoder, every, steps, send)

    def __call__(self, done: int, latents: torch.Tensor, scheduler: object, total: int | None = None) -> None:
        # The last step's preview would only race the final image (`total`: the steps the run makes, fewer than
        # asked for with an image's strength).
        if done % self.every or done >= (total or self.steps):
            return
        started = time.perf_counter()
        image = self.decoder(latents, scheduler)
        if image is None:
            return
        logger.debug(
            "preview (%s) after step %d/%d in %.1f ms",
            self.decoder.name,
            done,
            self.steps,
            (time.perf_counter() - started) * 1000,
        )
        self.send(done, image)


def load_preview_decoder(
    settings: Settings, spec: FamilySpec, device: torch.device, dtype: torch.dtype
) -> PreviewDecoder | None:
    """The decoder `settings` ask for: None when previews are off; the family's TAESD when found locally;
    else its linear projection."""
    if not settings.previews:
        return None
    family, projection = spec.family, spec.preview.projection
    source = settings.preview_vae
    if source == "auto":
        source = spec.preview.tiny_vae or "none"
    if source != "none":
        decoder = _tiny_vae(source, device, dtype)
        if decoder is not None:
            return decoder
    if projection is None:
        logger.warning("no latent preview is known for the %s family; previews are off", family.value)
        return None
    logger.info("live previews: the fixed %s latent->RGB projection", family.value)
    return LinearPreview(projection, family, spec.preview.more_projections)


def _tiny_vae(source: str, device: torch.device, dtype: torch.dtype) -> TinyVaePreview | None:
    from diffusers import AutoencoderTiny
    from huggingface_hub import try_to_load_from_cache

    folder = Path(source)
    if not folder.is_dir():
        # The local cache only: a preview is worth no download, and a Space preloads it at build time.
        config = try_to_load_from_cache(source, "config.json")
        if not isinstance(config, str):
            logger.info("PREVIEW_VAE %s is not in the local Hugging Face cache; using the linear preview", source)
            return None
        folder = Path(config).parent
    try:
        vae = AutoencoderTiny.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as e:
        logger.warning("PREVIEW_VAE %s could not be loaded from %s (%s); using the linear preview", source, folder, e)
        return None
    vae = vae.to(device).eval().requires_grad_(False)
    logger.info("live previews: AutoencoderTiny from %s on %s", source, device)
    return TinyVaePreview(vae, source)


def _unit_variance(latents: torch.Tensor, scheduler: object) -> torch.Tensor:
    if not hasattr(scheduler, "scale_model_input"):
        # A flow-matching scheduler: x_t = (1 - sigma) x_0 + sigma * noise is at unit scale already.
        return latents
    sigmas = getattr(scheduler, "sigmas", None)
    index = getattr(scheduler, "step_index", None)
    if not isinstance(sigmas, torch.Tensor) or index is None or not 0 <= index < len(sigmas):
        return latents
    # After `step`, step_index points at the sigma of the latents just produced.
    sigma = float(sigmas[index])
    return latents / (sigma**2 + 1) ** 0.5


def _to_image(rgb: torch.Tensor) -> Image.Image:
    """(1, 3, H, W) in [-1, 1] -> an 8-bit RGB image, as diffusers post-processes a decoded image."""
    return _PROCESSOR.postprocess(rgb, output_type="pil")[0]
