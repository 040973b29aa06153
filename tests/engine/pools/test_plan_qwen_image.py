"""Qwen-Image in the start-up memory plan: its declared sizes are Qwen/Qwen-Image's (57.7 GB in bf16). In bf16
(QUANTIZE=off) it fits a 48 GB GPU alone only with its Qwen2.5-VL encoder in host RAM and a smaller adapter
cache, an 80 GB one with everything resident (beside SDXL too), never 24 GB; under QUANTIZE=auto its transformer
in fp8 fits 48 GB alone and beside SDXL, and 24 GB still not. Its encoder, when the plan leaves it in host RAM,
encodes prompts there and gives the image it gives on the device."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
from torch import nn
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from engine.errors import SettingsError
from engine.families import qwen_image
from engine.pipeline.loading import load_pipeline
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from engine.storage import linear_sizes
from families.qwen_image import MODEL_ID
from tests.support.dit import A10G, GIB, HOST_RAM, L40S, needs_on_a_gpu, values
from tests.support.dit import pipeline_image as image
from tests.support.images import assert_images_close

# What torch reports for an 80 GB A100 / H100, as tests/engine/pools/test_plan_reserve.py counts it.
A100 = 79 * GIB
# Qwen/Qwen-Image's config.json files, the fields that differ from diffusers' and transformers' defaults
# (transformer/: 60 blocks, 24 heads of 128, Qwen2.5-VL's 3584-wide input; text_encoder/: Qwen2.5-VL-7B-Instruct
# with its vision tower and LM head; vae/: diffusers' defaults are Qwen-Image's).
_TRANSFORMER = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "axes_dims_rope": (16, 56, 56),
}
_QWEN2_5_VL_7B = Qwen2_5_VLConfig(
    text_config={
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 128000,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
    },
    vision_config={
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
    tie_word_embeddings=False,
)


def test_declared_sizes_are_what_diffusers_and_transformers_build_from_qwen_images_configs():
    with torch.device("meta"):
        built = {
            "transformer": QwenImageTransformer2DModel(**_TRANSFORMER),
            "text_encoder": Qwen2_5_VLForConditionalGeneration(_QWEN2_5_VL_7B),
            "vae": AutoencoderKLQwenImage(),
        }
    assert dict(qwen_image.FAMILY.memory.values) == {name: values(module) for name, module in built.items()}
    # The largest weight a LoRA may touch sizes the swap's float32 scratch buffers on the device.
    assert qwen_image.FAMILY.memory.largest_values == largest_values([built[c] for c in qwen_image.FAMILY.components])
    assert qwen_image.FAMILY.memory.host_components == ("text_encoder",)
    assert "text_encoder" not in qwen_image.FAMILY.components
    # fp8 storage's sizes (engine.storage): LoRA branches on every Linear; no text encoder is adapted.
    transformer = built["transformer"]
    linears = [(n, m.out_features, m.in_features) for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    assert qwen_image.MEMORY.linears == linear_sizes(linears, None) and qwen_image.MEMORY.largest_encoder_values == 0


def settings_for(*models: str, **changes: object) -> Settings:
    """bf16 (QUANTIZE=off) unless `changes` say otherwise."""
    return Settings(dtype="auto", device="cpu", pools=tuple(PoolSetting(m, m) for m in models)).replace(
        **{"host_ram_bytes": HOST_RAM, "quantize": "off", **changes}
    )


def test_qwen_image_in_bf16_is_its_57_7_gb_and_qwen2_5_vl_may_wait_in_host_ram():
    (need,) = needs_on_a_gpu(settings_for(MODEL_ID))
    assert need.weights / 1e9 == pytest.approx(57.70, abs=0.01)
    assert need.touchable == 2 * 20_430_401_088
    assert need.host_able == (("text_encoder", 2 * 8_292_166_824),)


def test_on_48_gb_qwen_image_fits_alone_only_with_qwen2_5_vl_in_host_ram_and_a_smaller_adapter_cache():
    with pytest.raises(
        SettingsError, match=r"accepted: QUANTIZE=auto .*; or DEVICE_CACHE_BYTES=768MiB; or a larger GPU: A100 or H100"
    ):
        default = settings_for(MODEL_ID)
        plan_memory(needs_on_a_gpu(default), L40S, PlanOptions.of(default))
    smaller = settings_for(MODEL_ID, device_cache_bytes=768 * 2**20)
    (placement,) = plan_memory(needs_on_a_gpu(smaller), L40S, PlanOptions.of(smaller)).placements
    assert placement.host_components == ("text_encoder",) and not placement.pristine
    assert placement.weights / GIB == pytest.approx(38.29, abs=0.01)
    beside = settings_for(MODEL_ID, DEFAULT_MODEL_ID, device_cache_bytes=768 * 2**20)
    with pytest.raises(SettingsError, match=r"A100 or H100 \(80 GB\)"):
        plan_memory(needs_on_a_gpu(beside), L40S, PlanOptions.of(beside))


def test_under_quantize_auto_its_transformer_in_fp8_fits_48_gb_alone_and_beside_sdxl_but_not_24_gb():
    alone = settings_for(MODEL_ID, quantize="auto")
    plan = plan_memory(needs_on_a_gpu(alone), L40S, PlanOptions.of(alone))
    (placement,) = plan.placements
    assert plan.auto_quantized == (MODEL_ID,) and not placement.host_components
    assert placement.nbytes / GIB == pytest.approx(36.94, abs=0.01)
    beside = settings_for(MODEL_ID, DEFAULT_MODEL_ID, quantize="auto")
    plan = plan_memory(needs_on_a_gpu(beside), L40S, PlanOptions.of(beside))
    assert plan.resident and plan.auto_quantized == (MODEL_ID,)
    assert plan.host_components(MODEL_ID) == ("text_encoder",)
    # On 24 GB only in int4 (QUANTIZE=auto's last storage), Qwen2.5-VL in host RAM.
    plan = plan_memory(needs_on_a_gpu(alone), A10G, PlanOptions.of(alone))
    assert plan.storage(MODEL_ID) == "int4" and plan.host_components(MODEL_ID) == ("text_encoder",)


def test_on_80_gb_qwen_image_is_resident_alone_and_beside_sdxl_and_24_gb_is_refused():
    for models in ((MODEL_ID,), (MODEL_ID, DEFAULT_MODEL_ID)):
        settings = settings_for(*models)
        plan = plan_memory(needs_on_a_gpu(settings), A100, PlanOptions.of(settings))
        assert plan.resident and all(not p.host_components for p in plan.placements), models
    alone = settings_for(MODEL_ID)
    with pytest.raises(SettingsError, match=r"accepted: QUANTIZE=auto .*; or a larger GPU: A100 or H100 \(80 GB\)$"):
        plan_memory(needs_on_a_gpu(alone), A10G, PlanOptions.of(alone))


def test_qwen2_5_vl_left_in_host_ram_encodes_there_and_the_image_is_the_same(
    loaded_qwen_image, tiny_qwen_image_dir, base_settings
):
    """On the CPU both places are host RAM: this checks the hooks leave the pipeline's call and image as they were."""
    settings = base_settings.replace(model_id=str(tiny_qwen_image_dir), base_model_id=MODEL_ID)
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.host_components == ("text_encoder",)
    # Another pipeline than the session's, its weights in other storage: within 2 levels (tests/support/images.py).
    assert_images_close(image(hosted), image(loaded_qwen_image))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_qwen2_5_vl_in_host_ram_gives_the_devices_image(tiny_qwen_image_dir, base_settings):
    settings = base_settings.replace(
        model_id=str(tiny_qwen_image_dir), base_model_id=MODEL_ID, device="cuda", dtype="auto"
    )
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.pipe.text_encoder.device.type == "cpu" and hosted.pipe.transformer.device.type == "cuda"
    on_device = load_pipeline(settings)
    # Qwen2.5-VL in bf16 on the CPU and on the GPU round differently; 2 levels on 8-bit images, as elsewhere.
    assert_images_close(image(hosted), image(on_device))
