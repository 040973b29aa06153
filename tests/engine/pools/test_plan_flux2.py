"""FLUX.2 [klein] in the start-up memory plan: its declared sizes are klein 4B's and 9B's as diffusers and
transformers build them; which GPUs serve each, alone and beside SDXL; FLUX.2 [dev]'s sizes and GPUs; Qwen3
left in host RAM encodes there and gives the image it gives on the device."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine.errors import SettingsError
from engine.families import flux2, flux2_dev
from engine.pipeline.loading import load_pipeline
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from engine.storage import linear_sizes
from families.flux2 import BASE_9B, MODEL_ID, MODEL_ID_9B
from families.flux2_dev import MODEL_ID as DEV
from tests.support.dit import A10G, GIB, HOST_RAM, L40S, needs_on_a_gpu, values
from tests.support.dit import pipeline_image as image
from tests.support.images import assert_images_close

# About what torch reports for an 80 GB A100 and a T4 (as A10G and L40S in tests/support/dit.py).
A100 = 81_038 * 2**20
T4 = 15_095 * 2**20
# black-forest-labs/FLUX.2-klein-4B's and -9B's config.json files, the fields that differ from diffusers' and
# transformers' defaults (transformer/; text_encoder/ Qwen3-4B and Qwen3-8B; vae/: diffusers' defaults are FLUX.2's).
_TRANSFORMERS = {
    "4B": {"num_layers": 5, "num_single_layers": 20, "num_attention_heads": 24, "joint_attention_dim": 7680},
    "9B": {"num_layers": 8, "num_single_layers": 24, "num_attention_heads": 32, "joint_attention_dim": 12288},
}
_QWEN3 = {
    "4B": {"hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True},
    "9B": {"hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
}


def qwen3(size: str) -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=151936,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            **_QWEN3[size],
        )
    )


@pytest.mark.parametrize(("size", "memory"), [("4B", flux2.MEMORY), ("9B", flux2.MEMORY_9B)])
def test_declared_sizes_are_what_diffusers_and_transformers_build_from_kleins_configs(size, memory):
    with torch.device("meta"):
        built = {
            "transformer": Flux2Transformer2DModel(guidance_embeds=False, **_TRANSFORMERS[size]),
            "text_encoder": qwen3(size),
            "vae": AutoencoderKLFlux2(),
        }
    assert dict(memory.values) == {name: values(module) for name, module in built.items()}
    assert memory.largest_values == largest_values([built["transformer"]])
    assert memory.host_components == ("text_encoder",) and "text_encoder" not in flux2.FAMILY.components


def test_flux2_devs_sizes_are_its_transformer_as_diffusers_builds_it_and_the_24_b_encoder():
    with torch.device("meta"):
        transformer = Flux2Transformer2DModel()  # diffusers' defaults are FLUX.2 [dev]'s
    assert flux2_dev.MEMORY.values_of(("transformer",)) == values(transformer)
    assert flux2_dev.MEMORY.largest_values == largest_values([transformer])
    linears = [(n, m.out_features, m.in_features) for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    assert flux2_dev.MEMORY.linears == linear_sizes(linears, None)
    assert flux2_dev.FAMILY.memory is flux2_dev.MEMORY and flux2_dev.MEMORY.host_components == ("text_encoder",)


def test_the_9b_bases_are_planned_at_their_own_size():
    assert flux2.FAMILY.memory_of(MODEL_ID) is flux2.MEMORY
    assert flux2.FAMILY.memory_of(MODEL_ID_9B) is flux2.MEMORY_9B and flux2.FAMILY.memory_of(BASE_9B.upper())
    (need,) = needs_on_a_gpu(settings_for(MODEL_ID_9B))
    assert need.weights == 2 * flux2.MEMORY_9B.total_values


def settings_for(*models: str, **changes: object) -> Settings:
    return Settings(dtype="auto", device="cpu", pools=tuple(PoolSetting(m, m) for m in models)).replace(
        **{"host_ram_bytes": HOST_RAM, **changes}
    )


def plan(settings: Settings, total: int):
    return plan_memory(needs_on_a_gpu(settings), total, PlanOptions.of(settings))


def test_klein_4b_fits_24_gb_alone_with_qwen3_in_host_ram_and_beside_sdxl_by_taking_turns():
    alone = settings_for(MODEL_ID)
    (placement,) = plan(alone, A10G).placements
    assert placement.host_components == ("text_encoder",)
    assert placement.weights / GIB == pytest.approx(7.38, abs=0.01)
    with pytest.raises(SettingsError, match=r"A10G or L4 \(24 GB\)"):
        plan(alone, T4)
    beside = settings_for(MODEL_ID, DEFAULT_MODEL_ID)
    shared = plan(beside, A10G)
    assert not shared.resident and shared.host_components(MODEL_ID) == ("text_encoder",)
    both = plan(beside.replace(pool_offload=False), L40S)
    assert both.resident and all(not p.host_components for p in both.placements)


def test_klein_9b_needs_48_gb_alone_and_beside_sdxl():
    alone = settings_for(MODEL_ID_9B)
    with pytest.raises(SettingsError, match=r"L40S \(48 GB\)"):
        plan(alone, A10G)
    (placement,) = plan(alone, L40S).placements
    assert placement.weights / GIB == pytest.approx(32.32, abs=0.01)
    both = plan(settings_for(MODEL_ID_9B, DEFAULT_MODEL_ID, pool_offload=False), L40S)
    assert both.resident and both.host_components(MODEL_ID_9B) == ("text_encoder",)


def test_flux2_dev_fits_80_gb_in_bf16_and_48_gb_in_fp8_each_with_mistral_in_host_ram():
    """112.6 GB in bf16: on 80 GB resident with Mistral (48 GB) and the pristine copies in host RAM, whatever
    QUANTIZE says; on 48 GB only with the transformer in fp8 (QUANTIZE=auto), Mistral in host RAM."""
    for quantize in ("off", "auto"):
        settings = settings_for(DEV, quantize=quantize)
        plan_ = plan_memory(needs_on_a_gpu(settings), A100, PlanOptions.of(settings))
        (placement,) = plan_.placements
        assert placement.host_components == ("text_encoder",) and not placement.pristine and not plan_.auto_quantized
        assert placement.weights / GIB == pytest.approx(60.18, abs=0.01)
    off = settings_for(DEV, quantize="off")
    with pytest.raises(SettingsError, match=r"accepted: QUANTIZE=auto .*; or a larger GPU: A100 or H100 \(80 GB\)"):
        plan_memory(needs_on_a_gpu(off), L40S, PlanOptions.of(off))
    auto = settings_for(DEV, quantize="auto")
    plan_ = plan_memory(needs_on_a_gpu(auto), L40S, PlanOptions.of(auto))
    (placement,) = plan_.placements
    assert plan_.auto_quantized == (DEV,) and placement.host_components == ("text_encoder",)
    assert placement.nbytes / GIB == pytest.approx(31.73, abs=0.01)
    with pytest.raises(
        SettingsError, match=r"\(denoiser in int4\).*accepted: LORA_MAX_RANK=32 .*; or a larger GPU: L40S \(48 GB\)$"
    ):
        plan_memory(needs_on_a_gpu(auto), A10G, PlanOptions.of(auto))


def test_qwen3_left_in_host_ram_encodes_there_and_the_image_is_the_same(loaded_flux2, tiny_flux2_dir, base_settings):
    """On the CPU both places are host RAM: this checks the hooks leave the pipeline's call and image as they were."""
    settings = base_settings.replace(model_id=str(tiny_flux2_dir), base_model_id=MODEL_ID)
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.host_components == ("text_encoder",)
    assert_images_close(image(hosted), image(loaded_flux2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_qwen3_in_host_ram_gives_the_devices_image(tiny_flux2_dir, base_settings):
    settings = base_settings.replace(model_id=str(tiny_flux2_dir), base_model_id=MODEL_ID, device="cuda", dtype="auto")
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.pipe.text_encoder.device.type == "cpu" and hosted.pipe.transformer.device.type == "cuda"
    on_device = load_pipeline(settings)
    # Qwen3 in bf16 on the CPU and on the GPU round differently; 2 levels on 8-bit images, as elsewhere.
    assert_images_close(image(hosted), image(on_device))
