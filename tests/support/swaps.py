"""Each DiT family's part in the swap tests every family shares (tests/engine/families/test_swaps.py): its LoRA
namings and the files it refuses, the request its tests send, and diffusers' own reference (its pipeline class,
the components `fuse_lora` fuses, its guidance). A family with a tiny pipeline adds its row here; the tests are
the same for all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    ChromaPipeline,
    Flux2KleinPipeline,
    Flux2Pipeline,
    FluxPipeline,
    Krea2Pipeline,
    QwenImageEditPipeline,
    QwenImageEditPlusPipeline,
    ZImagePipeline,
)
from diffusers.models import FluxTransformer2DModel
from PIL import Image

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.requests import GenerateRequest, LoraSpec
from families import Family
from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support import chroma, flux, flux2, krea2, qwen_image, zimage
from tests.support.dit import PROMPT, diffusers_image
from tests.support.image_inputs import PROMPT as EDIT_PROMPT
from tests.support.image_inputs import example_image, input_image
from tests.support.tiny import TinyModels

# musubi-tuner's ModelSpec architecture for a Qwen-Image-Edit LoRA (its utils/sai_model_spec.py).
EDIT_METADATA = {"modelspec.architecture": "Qwen-Image-Edit/lora"}
# And for a Qwen-Image-Edit-2509 LoRA.
PLUS_METADATA = {"modelspec.architecture": "Qwen-Image-Edit-Plus/lora"}
# A klein LoRA (ai-toolkit's names) for the tiny klein, in FLUX.2 [dev]'s folder.
KLEIN_LORA = "klein_aitk.safetensors"


@dataclass(frozen=True)
class Refusal:
    """Every `every`-th swap (at index `at`), a request the engine refuses with `error`: the file `ref` (None: the
    swap's own file) with `fields` changed."""

    every: int
    at: int
    error: type[Exception]
    ref: str | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SwapFamily:
    """One family's namings (`cases`: each with `name`, `file_name`, `reference_name`), how its tests' files are
    written (`write(models, folder)`), its request (`request(*loras, **fields)`), diffusers' reference image
    (`reference(tiny_dir, folder, weight_name, scale)`), the components each naming adapts, and the bit-exact
    test's swaps (`restore_cases`, at `restore_steps`) and refusals."""

    family: Family
    cases: Sequence[Any]
    write: Callable[[TinyModels, Path], None]
    request: Callable[..., GenerateRequest]
    reference: Callable[[Path, Path, str | None, float], Image.Image]
    components: Callable[[Any], tuple[str, ...]]
    restore_cases: Sequence[Any]
    refusals: tuple[Refusal, ...]
    restore_steps: int = 1
    mode: str = "text-to-image"
    # Beyond the 2 levels a pixel: the mean difference from diffusers' image is under this (None: not checked).
    mean_below: float | None = None


def _request(prompt: str = PROMPT, **defaults: Any) -> Callable[..., GenerateRequest]:
    """Three steps at 64 px, seed 7, with the family's defaults; `fields` change any."""

    def make(*loras: LoraSpec, **fields: Any) -> GenerateRequest:
        values = {"prompt": prompt, "steps": 3, "width": 64, "height": 64, "seed": 7, **defaults, **fields}
        return GenerateRequest(loras=tuple(loras), **values)

    return make


def _fused(pipeline_class: Any, components: tuple[str, ...], guidance: float):
    def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float) -> Image.Image:
        return diffusers_image(
            pipeline_class, tiny_dir, folder, weight_name, components=components, scale=scale, guidance=guidance
        )

    return reference


def _transformer(case: Any) -> tuple[str, ...]:
    return ("transformer",)


# -- each family's files -----------------------------------------------------------------------------------------


def _flux_files(models: TinyModels, folder: Path) -> None:
    flux.write_flux_loras(models.loaded(Family.FLUX).pipe, folder, cases=(*flux.CASES, *flux.BFL_CASES, flux.FAL_CASE))
    # Made for a wider FLUX (48 wide): its factors fit no served layer.
    with torch.device("meta"):
        wider = FluxTransformer2DModel(num_layers=1, num_single_layers=1, num_attention_heads=3, attention_head_dim=16)
    save_lora(folder / "wide_peft.safetensors", make_flux_lora(flux_layers(wider), rank=2, seed=5).twin())


def _flux2_files(models: TinyModels, folder: Path) -> None:
    flux2.write_flux2_loras(models.loaded(Family.FLUX2).pipe, folder)
    # Made for a klein of another width (64, where the tiny one is 56).
    wide = {k: (torch.ones(2, 64), torch.ones(3 * 64, 2)) for k in flux2.ATTENTION[:1]}
    save_lora(folder / "flux2_wide.safetensors", flux2.lora_file(wide, "aitk"))
    flux.write_flux_loras(models.loaded(Family.FLUX).pipe, folder, cases=flux.CASES)


def _flux2_dev_files(models: TinyModels, folder: Path) -> None:
    flux2.write_flux2_loras(models.loaded(Family.FLUX2_DEV).pipe, folder)
    apart = folder / "klein"
    apart.mkdir()
    klein = flux2.write_flux2_loras(
        models.loaded(Family.FLUX2).pipe, apart, cases=[c for c in flux2.CASES if c.name == "aitk"]
    )
    (apart / klein["aitk"].file_name).rename(folder / KLEIN_LORA)


def _zimage_files(models: TinyModels, folder: Path) -> None:
    zimage.write_zimage_loras(models.loaded(Family.ZIMAGE).pipe, folder)
    # Made for a wider Z-Image (64 wide, where the tiny one is 24).
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in zimage.MODULES[:2]}
    save_lora(folder / "zimage_wide.safetensors", zimage.lora_file(wide, "peft", None))


def _chroma_files(models: TinyModels, folder: Path) -> None:
    chroma.write_chroma_loras(models.loaded(Family.CHROMA).pipe, folder)
    # A FLUX.1 LoRA adapting FLUX.1's modulations, which Chroma lacks (the tiny FLUX.1 is as wide as Chroma).
    chroma.write_flux_loras_for_chroma(models.loaded(Family.FLUX).pipe, folder)


def _krea2_files(models: TinyModels, folder: Path) -> None:
    krea2.write_krea2_loras(models.loaded(Family.KREA2).pipe, folder)
    # Made for a wider Krea 2 (64 wide, where the tiny one is 104).
    wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in krea2.MODULES[:2]}
    save_lora(folder / "krea2_wide.safetensors", krea2.lora_file(wide, "peft"))


def _qwen_files(family: Family, prefix: str, metadata: dict[str, str] | None):
    def write(models: TinyModels, folder: Path) -> None:
        qwen_image.write_qwen_loras(models.loaded(family).pipe, folder, metadata=metadata)
        # Made for a wider Qwen-Image (64 wide, where the tiny ones are 72 and 96).
        wide = {m: (torch.ones(2, 64), torch.ones(64, 2)) for m in qwen_image.MODULES[:2]}
        save_lora(folder / f"{prefix}_wide.safetensors", qwen_image.lora_file(wide, "peft", None), metadata)

    return write


def _qwen_reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float) -> Image.Image:
    return qwen_image.diffusers_image(tiny_dir, folder, weight_name, scale=scale)


def _edit_reference(pipeline_class: Any) -> Callable[[Path, Path, str | None, float], Image.Image]:
    """diffusers' own edit: `pipeline_class` (QwenImageEditPipeline, QwenImageEditPlusPipeline) from the folder,
    the LoRA fused into the transformer, two steps without true CFG at the image's 64 px, seed 7."""

    def reference(tiny_dir: Path, folder: Path, weight_name: str | None, scale: float) -> Image.Image:
        pipe: Any = pipeline_class.from_pretrained(tiny_dir)
        if weight_name is not None:
            pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
            pipe.fuse_lora(components=["transformer"], lora_scale=scale)
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator("cpu").manual_seed(7)
        arguments = {"num_inference_steps": 2, "true_cfg_scale": 1.0, "width": 64, "height": 64}
        return pipe(prompt=EDIT_PROMPT, image=example_image(), generator=generator, **arguments).images[0]

    return reference


def _edit_request(*loras: LoraSpec, **fields: Any) -> GenerateRequest:
    """Two steps without true CFG (one transformer pass a step) at the image's 64 px, seed 7."""
    request = {"prompt": EDIT_PROMPT, "steps": 2, "guidance": 1.0, "seed": 7, "image": input_image()}
    return GenerateRequest(loras=loras, **(request | fields))


FAMILIES = (
    SwapFamily(
        Family.FLUX,
        (*flux.CASES, *flux.BFL_CASES, flux.FAL_CASE),
        _flux_files,
        _request(guidance=3.5),
        _fused(FluxPipeline, ("transformer", "text_encoder"), 3.5),
        lambda case: ("transformer", "text_encoder") if case.text else ("transformer",),
        (*flux.CASES, *flux.BFL_CASES, *flux.CASES),
        (Refusal(4, 1, IncompatibleLoraError, "wide_peft.safetensors"),),
        mean_below=0.1,
    ),
    SwapFamily(
        Family.ZIMAGE,
        zimage.CASES,
        _zimage_files,
        _request(guidance=0.0),
        _fused(ZImagePipeline, ("transformer",), 0.0),
        _transformer,
        (*zimage.CASES, *zimage.CASES),
        (Refusal(3, 1, IncompatibleLoraError, "zimage_wide.safetensors"),),
        mean_below=0.1,
    ),
    SwapFamily(
        Family.KREA2,
        krea2.CASES,
        _krea2_files,
        _request(guidance=0.0),
        _fused(Krea2Pipeline, ("transformer",), 0.0),
        _transformer,
        (*krea2.CASES, *krea2.CASES),
        (Refusal(3, 1, IncompatibleLoraError, "krea2_wide.safetensors"),),
        mean_below=0.1,
    ),
    SwapFamily(
        Family.FLUX2,
        flux2.CASES,
        _flux2_files,
        _request(),
        _fused(Flux2KleinPipeline, ("transformer",), 1.0),
        _transformer,
        (*flux2.CASES, *flux2.CASES),
        (
            Refusal(3, 1, IncompatibleLoraError, "flux2_wide.safetensors"),
            # A FLUX.1 LoRA (its shapes say so) on the klein engine.
            Refusal(4, 2, IncompatibleLoraError, "flux_kohya_linear1.safetensors"),
        ),
    ),
    SwapFamily(
        Family.QWEN_IMAGE,
        qwen_image.CASES,
        _qwen_files(Family.QWEN_IMAGE, "qwen", None),
        _request(guidance=1.0),
        _qwen_reference,
        _transformer,
        (*qwen_image.CASES, *qwen_image.CASES),
        (Refusal(3, 1, IncompatibleLoraError, "qwen_wide.safetensors"),),
        # At one step, Qwen-Image's `shift_terminal` stretch divides by zero in diffusers' scheduler.
        restore_steps=2,
    ),
    SwapFamily(
        Family.FLUX2_DEV,
        flux2.CASES,
        _flux2_dev_files,
        _request(),
        _fused(Flux2Pipeline, ("transformer",), 4.0),
        _transformer,
        flux2.CASES,
        (Refusal(3, 1, IncompatibleLoraError, KLEIN_LORA),),
    ),
    SwapFamily(
        Family.QWEN_IMAGE_EDIT,
        qwen_image.CASES,
        _qwen_files(Family.QWEN_IMAGE_EDIT, "edit", EDIT_METADATA),
        _edit_request,
        _edit_reference(QwenImageEditPipeline),
        _transformer,
        qwen_image.CASES[:4],
        (
            Refusal(2, 1, IncompatibleLoraError, "edit_wide.safetensors"),
            Refusal(2, 1, InvalidRequestError, None, {"image": None}),
        ),
        restore_steps=2,
        mode="image-to-image",
    ),
    SwapFamily(
        Family.QWEN_IMAGE_EDIT_PLUS,
        qwen_image.CASES,
        _qwen_files(Family.QWEN_IMAGE_EDIT_PLUS, "plus", PLUS_METADATA),
        _edit_request,
        _edit_reference(QwenImageEditPlusPipeline),
        _transformer,
        qwen_image.CASES[:4],
        (
            Refusal(2, 1, IncompatibleLoraError, "plus_wide.safetensors"),
            Refusal(2, 1, InvalidRequestError, None, {"image": None}),
        ),
        restore_steps=2,
        mode="image-to-image",
    ),
    SwapFamily(
        Family.CHROMA,
        chroma.CASES,
        _chroma_files,
        _request(guidance=3.0),
        _fused(ChromaPipeline, ("transformer",), 3.0),
        _transformer,
        (*chroma.CASES, *chroma.CASES),
        (Refusal(3, 1, IncompatibleLoraError, "flux1_with_modulations.safetensors"),),
        mean_below=0.1,
    ),
)
