"""Chroma1-HD in the start-up memory plan: its declared sizes are what diffusers and transformers build from its
configs; on a 24 GB GPU it fits only with its denoiser quantized (fp8 by QUANTIZE=auto, with T5 in host RAM; int4 or
a GGUF file with T5 resident), and on an L40S in bf16 as loaded, or in each quantized storage."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, ChromaTransformer2DModel
from torch import nn
from transformers import T5EncoderModel

from engine.errors import SettingsError
from engine.families import chroma
from engine.models import parse_models
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import Settings
from engine.storage import linear_sizes
from families.chroma import MODEL_ID
from tests.engine.pools.test_plan_flux import _T5_XXL
from tests.support.dit import A10G, FLUX1_VAE, HOST_RAM, L40S, needs_on_a_gpu, values

# A Q4_K GGUF file of Chroma1-HD as a `MODELS` item (the repo and file names are illustrative: the plan reads only
# the quant type in the name; nothing is fetched).
GGUF = f"{MODEL_ID}@silveroxides/Chroma1-HD-GGUF/Chroma1-HD-Q4_K_M.gguf"


def settings_for(models: str, quantize: str = "auto") -> Settings:
    return Settings(dtype="auto", device="cpu", pools=parse_models(models)).replace(
        host_ram_bytes=HOST_RAM, quantize=quantize
    )


def test_declared_sizes_are_what_diffusers_and_transformers_build_from_chroma1_hds_configs():
    with torch.device("meta"):
        # transformer/: ChromaTransformer2DModel's defaults are Chroma1-HD's; text_encoder/ T5-XXL's encoder (FLUX.1's
        # text_encoder_2); vae/ FLUX.1's.
        built = {
            "transformer": ChromaTransformer2DModel(),
            "text_encoder": T5EncoderModel(_T5_XXL),
            "vae": AutoencoderKL(**FLUX1_VAE),
        }
    memory = chroma.FAMILY.memory
    assert dict(memory.values) == {name: values(module) for name, module in built.items()}
    assert memory.largest_values == largest_values([built[c] for c in chroma.FAMILY.components])
    denoiser = built["transformer"]
    linears = [(n, m.out_features, m.in_features) for n, m in denoiser.named_modules() if isinstance(m, nn.Linear)]
    assert memory.linears == linear_sizes(linears, memory.branch_modules)
    # The modulation network is about 250 M values (FLUX.1's modulations hold 3.3 B).
    assert sum(p.numel() for p in denoiser.distilled_guidance_layer.parameters()) / 1e6 == pytest.approx(278, abs=1)
    assert memory.host_components == ("text_encoder",) and "text_encoder" not in chroma.FAMILY.components


def test_on_24_gb_chroma_fits_only_quantized():
    with pytest.raises(SettingsError, match=r"do not fit this GPU"):
        plan_memory(needs_on_a_gpu(settings_for(MODEL_ID, "off")), A10G, PlanOptions.of(settings_for(MODEL_ID, "off")))
    auto = settings_for(MODEL_ID)
    plan = plan_memory(needs_on_a_gpu(auto), A10G, PlanOptions.of(auto))
    assert plan.resident and plan.auto_quantized == (MODEL_ID,) and plan.host_components(MODEL_ID) == ("text_encoder",)
    assert [p.storage for p in plan.placements] == ["fp8"]
    for models, quantize, storage in ((MODEL_ID, "int4", "int4"), (GGUF, "auto", "gguf")):
        settings = settings_for(models, quantize)
        (placement,) = plan_memory(needs_on_a_gpu(settings), A10G, PlanOptions.of(settings)).placements
        # T5 stays on the device beside a 4-bit denoiser.
        assert placement.storage.startswith(storage) and placement.host_components == (), storage


def test_on_an_l40s_chroma_is_resident_in_bf16_and_in_every_quantized_storage():
    native = settings_for(MODEL_ID)
    plan = plan_memory(needs_on_a_gpu(native), L40S, PlanOptions.of(native))
    assert plan.resident and not plan.auto_quantized and [p.storage for p in plan.placements] == ["native"]
    assert plan.host_components(MODEL_ID) == ()
    for models, quantize, storage in ((MODEL_ID, "fp8", "fp8"), (MODEL_ID, "int4", "int4"), (GGUF, "auto", "gguf")):
        settings = settings_for(models, quantize)
        quantized = plan_memory(needs_on_a_gpu(settings), L40S, PlanOptions.of(settings))
        assert quantized.resident and quantized.placements[0].storage.startswith(storage), storage
        assert quantized.placements[0].nbytes < plan.placements[0].nbytes
