"""The offline demo's LoRAs: synthetic LoRAs for the tiny pipelines, made locally, with previews.

When neither a GPU nor the Hub is at hand the Space serves the tiny random-weight
SDXL, SD 1.5 and FLUX.1 pipelines, and the catalogue needs LoRAs that fit each. These are random low-rank
factors (see `serving.demo.synthetic`, and `serving.demo.synthetic_flux` for FLUX's namings: kohya,
diffusers, XLabs, ComfyUI) saved as ordinary local LoRA files, with the
ModelSpec metadata the local catalogue source reads (title, trigger phrase,
license), and a preview rendered by the tiny pipeline with that LoRA, saved
next to it as `<stem>.png`. Files are written once; a marker records the format,
so a changed set is rewritten instead of mixed with the old one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image

from engine.pipeline.loading import Pipeline
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import DEMO_POOLS
from serving.backends import Backend, blocking
from serving.demo.synthetic import (
    TEXT_ATTENTION,
    UNET_ATTENTION,
    UNET_ATTENTION_FF_CONV,
    KohyaNames,
    find_targets,
    kohya_metadata,
    make_lora,
    peft_metadata,
    save_lora,
)
from serving.demo.synthetic_flux import FluxFormat, flux_layers, make_flux_lora

__all__ = [
    "DEMO_ALL",
    "DEMO_FLUX_LORAS",
    "DEMO_LORAS",
    "DEMO_SD15_LORAS",
    "PREVIEW_PROMPT",
    "DemoLora",
    "demo_loras",
    "ensure_demo_loras",
    "render_previews",
    "write_demo_lora",
]

logger = logging.getLogger(__name__)

# The demo pools' bases, in the registry's order (`FamilyIdentity.demo`): SDXL's (the default), SD 1.5's and
# FLUX.1's, each with its LoRAs below; a family joining the demo brings its LoRAs here (this unpacking fails till).
DEFAULT_MODEL_ID, SD15_MODEL_ID, FLUX_MODEL_ID = (pool.base_model_id for pool in DEMO_POOLS)
_FORMAT = 3
_MARKER = "switchboard_demo.json"
_ARCHITECTURES = {
    DEFAULT_MODEL_ID: "stable-diffusion-xl-v1-base/lora",
    SD15_MODEL_ID: "stable-diffusion-v1/lora",
    FLUX_MODEL_ID: "flux-1-dev/lora",
}
_KOHYA_VERSIONS = {DEFAULT_MODEL_ID: "sdxl_base_v1-0", SD15_MODEL_ID: "sd_v1", FLUX_MODEL_ID: "flux1"}


PREVIEW_PROMPT = "a fox in a forest at sunset"
_PREVIEW_SEED = 7
# Previews are upscaled with NEAREST so the gallery shows the model's own pixels, not a blur of them.
_PREVIEW_SIDE = 256


@dataclass(frozen=True)
class DemoLora:
    """One demo LoRA: how it is made and what its metadata says."""

    stem: str
    title: str
    trigger: str
    license: str
    description: str
    fmt: Literal["peft", "kohya"] | FluxFormat
    seed: int
    strength: float
    rank: int = 4
    text_encoders: bool = False
    conv: bool = False
    base: str = DEFAULT_MODEL_ID

    @property
    def file_name(self) -> str:
        return f"{self.stem}.safetensors"

    @property
    def ref(self) -> str:
        return f"local:{self.file_name}"


DEMO_LORAS: tuple[DemoLora, ...] = (
    DemoLora(
        "ember_glaze",
        "Ember Glaze",
        "ember style",
        "openrail++",
        "Warm, kiln-fired noise.",
        "kohya",
        seed=101,
        strength=3.0,
        conv=True,
    ),
    DemoLora(
        "tidepool",
        "Tidepool",
        "tidepool",
        "cc-by-4.0",
        "Cool ripples; adapts both text encoders too.",
        "peft",
        seed=102,
        strength=3.0,
        text_encoders=True,
    ),
    DemoLora(
        "neon_static",
        "Neon Static",
        "neon static",
        "cc-by-nc-4.0",
        "Non-commercial, to show the licence badge.",
        "kohya",
        seed=103,
        strength=5.0,
    ),
    DemoLora(
        "moss_and_stone",
        "Moss & Stone",
        "mossy",
        "apache-2.0",
        "A gentle, low-strength nudge.",
        "peft",
        seed=104,
        strength=2.0,
    ),
    DemoLora(
        "pixel_drift",
        "Pixel Drift",
        "pxdrift",
        "mit",
        "Strong, rank 8, with conv layers.",
        "kohya",
        seed=105,
        strength=6.0,
        rank=8,
        conv=True,
    ),
    DemoLora(
        "aurora_veil",
        "Aurora Veil",
        "aurora veil",
        "cc-by-nc-sa-4.0",
        "Another non-commercial one.",
        "peft",
        seed=106,
        strength=4.0,
        text_encoders=True,
    ),
)


DEMO_SD15_LORAS: tuple[DemoLora, ...] = (
    DemoLora(
        "dusty_rose",
        "Dusty Rose",
        "dusty rose",
        "openrail",
        "SD 1.5, kohya naming with conv layers and the text encoder (lora_te_).",
        "kohya",
        seed=201,
        strength=3.0,
        text_encoders=True,
        conv=True,
        base=SD15_MODEL_ID,
    ),
    DemoLora(
        "lantern_glow",
        "Lantern Glow",
        "lantern glow",
        "cc-by-4.0",
        "SD 1.5, diffusers/PEFT naming.",
        "peft",
        seed=202,
        strength=4.0,
        base=SD15_MODEL_ID,
    ),
    DemoLora(
        "cobalt_ink",
        "Cobalt Ink",
        "cobalt ink",
        "cc-by-nc-4.0",
        "SD 1.5, non-commercial.",
        "kohya",
        seed=203,
        strength=5.0,
        base=SD15_MODEL_ID,
    ),
)


DEMO_FLUX_LORAS: tuple[DemoLora, ...] = (
    DemoLora(
        "copper_bloom",
        "Copper Bloom",
        "copper bloom",
        "other",
        "FLUX.1, kohya naming over BFL's fused qkv and linear1, with .alpha and a CLIP part (lora_te1_).",
        "kohya",
        seed=301,
        strength=1.0,
        text_encoders=True,
        base=FLUX_MODEL_ID,
    ),
    DemoLora(
        "glass_tide",
        "Glass Tide",
        "glass tide",
        "apache-2.0",
        "FLUX.1, diffusers/PEFT naming.",
        "peft",
        seed=302,
        strength=1.0,
        base=FLUX_MODEL_ID,
    ),
    DemoLora(
        "static_fern",
        "Static Fern",
        "static fern",
        "cc-by-nc-4.0",
        "FLUX.1, XLabs naming (attention processors only).",
        "xlabs",
        seed=303,
        strength=1.5,
        base=FLUX_MODEL_ID,
    ),
    DemoLora(
        "ash_lantern",
        "Ash Lantern",
        "ash lantern",
        "mit",
        "FLUX.1, ComfyUI's diffusion_model. naming.",
        "comfy",
        seed=304,
        strength=1.0,
        base=FLUX_MODEL_ID,
    ),
)
_ALL = DEMO_ALL = (*DEMO_LORAS, *DEMO_SD15_LORAS, *DEMO_FLUX_LORAS)


def demo_loras(served: tuple[str, ...] = (DEFAULT_MODEL_ID,)) -> tuple[DemoLora, ...]:
    """The demo LoRAs for the served bases."""
    return tuple(lora for lora in _ALL if lora.base in served)


def ensure_demo_loras(folder: Path, pipes: Mapping[str, Pipeline] | Pipeline) -> tuple[Path, ...]:
    """Write the demo LoRA files for the tiny pipelines into `folder`, once; returns their paths.

    `pipes` maps each served base repo id to its pipeline; a lone pipeline is the tiny SDXL one.
    """
    by_base = dict(pipes) if isinstance(pipes, Mapping) else {DEFAULT_MODEL_ID: pipes}
    loras = demo_loras(tuple(by_base))
    folder = Path(folder)
    marker = folder / _MARKER
    wanted = {"format": _FORMAT, "loras": [lora.stem for lora in loras]}
    paths = tuple(folder / lora.file_name for lora in loras)
    if _read_marker(marker) == wanted and all(p.is_file() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("writing %d demo LoRAs to %s", len(loras), folder)
    for lora, path in zip(loras, paths, strict=True):
        tensors, metadata = _make(lora, by_base[lora.base])
        write_demo_lora(path, lora, tensors, metadata, _ARCHITECTURES[lora.base])
    marker.write_text(json.dumps(wanted))
    return paths


def write_demo_lora(
    path: Path, lora: DemoLora, tensors: Mapping[str, object], metadata: Mapping[str, str], architecture: str
) -> None:
    """One demo LoRA's file, with its ModelSpec metadata (`architecture`: its `modelspec.architecture`)."""
    _write_atomically(path, tensors, {**metadata, **_modelspec(lora, architecture)})
    # A preview of an older version of this LoRA would lie about it.
    path.with_suffix(".png").unlink(missing_ok=True)


def _make(lora: DemoLora, pipe: Pipeline) -> tuple[dict[str, object], dict[str, str]]:
    if lora.base == FLUX_MODEL_ID:
        return _make_flux(lora, pipe)
    encoders = [c for c in ("text_encoder", "text_encoder_2") if getattr(pipe, c, None) is not None]
    components = {c: getattr(pipe, c) for c in ("unet", *encoders)}
    patterns: dict[str, tuple[str, ...]] = {"unet": UNET_ATTENTION_FF_CONV if lora.conv else UNET_ATTENTION}
    if lora.text_encoders:
        patterns |= dict.fromkeys(encoders, TEXT_ATTENTION)
    targets = find_targets(components, patterns)
    names: KohyaNames = "sdxl" if lora.base == DEFAULT_MODEL_ID else "sd1"
    fmt: Literal["peft", "kohya"] = "kohya" if lora.fmt == "kohya" else "peft"
    tensors = make_lora(targets, rank=lora.rank, seed=lora.seed, fmt=fmt, strength=lora.strength, kohya_names=names)
    if lora.fmt == "kohya":
        base_version = _KOHYA_VERSIONS[lora.base]
        metadata = kohya_metadata(dim=lora.rank, alpha=float(lora.rank), title=lora.title, base_version=base_version)
    else:
        metadata = peft_metadata(targets, rank=lora.rank, alpha=float(lora.rank))
    return dict(tensors), metadata


def _make_flux(lora: DemoLora, pipe: Pipeline) -> tuple[dict[str, object], dict[str, str]]:
    if lora.fmt == "xlabs":
        xlabs = ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj")
        layers = flux_layers(pipe.transformer, double=xlabs, single=("qkv",))
    else:
        layers = flux_layers(pipe.transformer, pipe.text_encoder if lora.text_encoders else None)
    alpha = None if lora.fmt == "xlabs" else float(lora.rank)
    made = make_flux_lora(layers, rank=lora.rank, seed=lora.seed, strength=lora.strength, alpha=alpha)
    tensors, metadata = made.file(lora.fmt)
    if lora.fmt == "kohya":
        metadata = kohya_metadata(dim=lora.rank, alpha=float(lora.rank), title=lora.title, base_version="flux1")
    return dict(tensors), metadata


def render_previews(
    backend: Backend, folder: Path, *, stop: threading.Event | None = None, loras: tuple[DemoLora, ...] = _ALL
) -> int:
    """Render `<stem>.png` for each of `loras` in `folder` that has none, until `stop` is set; returns how many (a
    video LoRA's is its clip's first frame)."""
    folder = Path(folder)
    made = 0
    for lora in loras:
        target = folder / f"{lora.stem}.png"
        if stop is not None and stop.is_set():
            break
        if target.is_file() or not (folder / lora.file_name).is_file():
            continue
        request = GenerateRequest(
            prompt=f"{lora.trigger}, {PREVIEW_PROMPT}", loras=(LoraSpec(lora.ref),), seed=_PREVIEW_SEED
        )
        # The same path as every transport's: the pool's queue, the exact swap (waited on from this thread).
        result = blocking(backend.generate(request))
        image = result.image.resize((_PREVIEW_SIDE, _PREVIEW_SIDE), Image.Resampling.NEAREST)
        temp = target.with_name(f".{target.name}.tmp")
        image.save(temp, format="PNG")
        os.replace(temp, target)
        made += 1
    if made:
        logger.info("rendered %d demo previews in %s", made, folder)
    return made


def _modelspec(lora: DemoLora, architecture: str) -> dict[str, str]:
    return {
        "modelspec.architecture": architecture,
        "modelspec.title": lora.title,
        "modelspec.trigger_phrase": lora.trigger,
        "modelspec.license": lora.license,
        "modelspec.description": f"{lora.description} A synthetic demo LoRA for a tiny offline pipeline.",
        "modelspec.tags": "demo, synthetic",
    }


def _write_atomically(path: Path, tensors: Mapping[str, object], metadata: Mapping[str, str]) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_lora(Path(temp), tensors, metadata)  # type: ignore[arg-type]
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _read_marker(marker: Path) -> object:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
