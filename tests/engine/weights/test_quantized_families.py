"""Every served family with a tiny pipeline, its denoiser stored in fp8 (QUANTIZE=fp8) with a LoRA on every Linear
of it (a quantized pool takes none on convolutions), against diffusers' own pipeline on the same torchao-quantized
weights (`Float8WeightOnlyConfig`) with the LoRA loaded unfused: within 2 levels. The linears a family keeps in its
compute dtype (`keep_dtype_linears`: those whose weight dtype diffusers reads) stay unquantized in both; quantized,
Z-Image's failed every request."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from engine.families.registry import served_specs
from engine.families.spec import FamilySpec
from engine.families.tiny import ensure_tiny_pipeline
from engine.pipeline.loading import load_pipeline
from engine.pipeline.modes import accepted_arguments, image_arguments
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from engine.weights.quantized import BranchedLinear
from serving.demo.synthetic import find_targets, make_lora, save_lora
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.image_inputs import input_image
from tests.support.images import assert_images_close, level_difference

pytest.importorskip("torchao")

FAMILIES = [spec for spec in served_specs() if spec.identity.tiny_id is not None]
LORA = "every_linear.safetensors"


def request(spec: FamilySpec, *loras: LoraSpec) -> GenerateRequest:
    """Two steps at 64 px, seed 7; an editing family's with an image."""
    image = input_image() if spec.needs_image else None
    return GenerateRequest(prompt="a fox", loras=loras, steps=2, width=64, height=64, seed=7, image=image)


def kept(spec: FamilySpec, name: str) -> bool:
    return any(re.search(pattern, name) for pattern in spec.keep_dtype_linears)


def reference_image(spec: FamilySpec, folder: Path, loras: Path, checked: CheckedRequest) -> np.ndarray:
    """diffusers' pipeline from the same folder, its denoiser's linears quantized by torchao but those the family
    keeps, the LoRA loaded unfused, called as the engine calls it for `checked`."""
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    pipe: Any = spec.pipeline_class.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    for component in spec.stored:  # the denoiser, and Wan 2.2 A14B's transformer_2
        quantize_(
            getattr(pipe, component),
            Float8WeightOnlyConfig(),
            filter_fn=lambda module, name: isinstance(module, nn.Linear) and not kept(spec, name),
        )
    with warnings.catch_warnings():
        # PEFT warns that such a layer cannot merge: the reference never merges (it is the unfused one).
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name="a0")
        if "transformer_2" in spec.components:
            # A two-stage Wan's low-noise transformer takes the file too (quantized as well).
            pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name="a1", load_into_transformer_2=True)
    arguments = spec.call_arguments(checked)
    if checked.image is not None:
        arguments = {**accepted_arguments(pipe, arguments), **image_arguments(pipe, checked)}
    output = pipe(**arguments, generator=torch.Generator("cpu").manual_seed(7), output_type="pil")
    # A video family's first frame (the result's `image`).
    return pixels(output.frames[0][0] if hasattr(output, "frames") else output.images[0])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", FAMILIES, ids=[spec.family.value for spec in FAMILIES])
def test_each_family_in_fp8_with_a_lora_is_diffusers_unfused_on_torchaos_weights(spec, base_settings, tmp_path):
    folder = ensure_tiny_pipeline(tmp_path / "pipeline", model_id=str(spec.identity.tiny_id))
    settings = base_settings.replace(
        model_id=str(folder), base_model_id=spec.identity.model_id, quantize="fp8", lora_max_rank=4
    )
    loaded = load_pipeline(settings, warm=False)
    denoiser = loaded.denoiser
    modules = [(c, n, m) for c in spec.stored for n, m in getattr(loaded.pipe, c).named_modules()]
    linears = {f"{c}.{n}": m for c, n, m in modules if isinstance(m, nn.Linear)}
    assert linears and all(isinstance(m, BranchedLinear) for m in linears.values())
    assert all((m.weight.dtype == torch.float8_e4m3fn) != kept(spec, n.partition(".")[2]) for n, m in linears.items())
    loras = tmp_path / "loras"
    targets = [t for t in find_targets({spec.denoiser: denoiser}, {spec.denoiser: (".",)}) if not t.is_conv]
    # Its metadata names the family (ModelSpec's architecture), as editing families' LoRAs must.
    metadata = {"modelspec.architecture": f"{spec.identity.spellings.architectures[0]}/lora"}
    save_lora(loras / LORA, make_lora(targets, rank=4, seed=3, strength=0.3, dtype=torch.float32), metadata)
    with local_engine(loaded, settings.replace(local_lora_dir=loras), loras) as engine:
        base = generate(engine, request(spec)).image
        ours = generate(engine, request(spec, LoraSpec(f"local:{LORA}")))
    theirs = reference_image(spec, folder, loras, ours.request)
    assert pixels(ours.image).std() > 1, "a blank image (NaN latents decode to black)"
    assert level_difference(ours.image, base) > 2, "the LoRA must visibly change the image"
    assert_images_close(pixels(ours.image), theirs, spec.family)
