"""Z-Image Turbo in the start-up memory plan: its declared sizes are Z-Image-Turbo's, it fits a 24 GB GPU alone with
its Qwen3 encoder in host RAM (and beside SDXL by taking turns), both resident on 48 GB; its Qwen3 encoder, when
the plan leaves it in host RAM, encodes prompts there and gives the image it gives on the device."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, ZImageTransformer2DModel
from transformers import Qwen3Config, Qwen3Model

from engine.errors import SettingsError
from engine.families import zimage
from engine.pipeline.loading import load_pipeline
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from families.zimage import MODEL_ID as ZIMAGE_MODEL_ID
from tests.support.dit import A10G, FLUX1_VAE, GIB, HOST_RAM, L40S, needs_on_a_gpu, values
from tests.support.dit import pipeline_image as image
from tests.support.images import assert_images_close

# Tongyi-MAI/Z-Image-Turbo's config.json files, the fields that differ from diffusers' and transformers' defaults
# (transformer/: diffusers' defaults are Z-Image's; text_encoder/ Qwen3-4B; vae/ FLUX.1's: FLUX1_VAE).
_QWEN3_4B = Qwen3Config(
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)


def test_declared_sizes_are_what_diffusers_and_transformers_build_from_z_image_turbos_configs():
    with torch.device("meta"):
        built = {
            "transformer": ZImageTransformer2DModel(),
            "text_encoder": Qwen3Model(_QWEN3_4B),
            "vae": AutoencoderKL(**FLUX1_VAE),
        }
    assert dict(zimage.FAMILY.memory.values) == {name: values(module) for name, module in built.items()}
    # The largest weight a LoRA may touch sizes the swap's float32 scratch buffers on the device.
    assert zimage.FAMILY.memory.largest_values == largest_values([built[c] for c in zimage.FAMILY.components])
    # Qwen3 is the component a LoRA never changes and the one that may stay in host RAM.
    assert zimage.FAMILY.memory.host_components == ("text_encoder",)
    assert "text_encoder" not in zimage.FAMILY.components


def settings_for(*models: str, **changes: object) -> Settings:
    return Settings(dtype="auto", device="cpu", pools=tuple(PoolSetting(m, m) for m in models)).replace(
        **{"host_ram_bytes": HOST_RAM, **changes}
    )


def test_z_image_turbo_in_bf16_is_its_20_5_gb_and_qwen3_may_wait_in_host_ram():
    (need,) = needs_on_a_gpu(settings_for(ZIMAGE_MODEL_ID))
    assert need.weights == 2 * 10_261_196_643 and need.weights / 1e9 == pytest.approx(20.52, abs=0.01)
    assert need.touchable == 2 * 6_154_908_736
    assert need.host_able == (("text_encoder", 2 * 4_022_468_224),)


def test_z_image_fits_24_gb_alone_with_qwen3_in_host_ram_and_beside_sdxl_by_taking_turns():
    alone = settings_for(ZIMAGE_MODEL_ID)
    (placement,) = plan_memory(needs_on_a_gpu(alone), A10G, PlanOptions.of(alone)).placements
    assert placement.host_components == ("text_encoder",) and not placement.pristine
    # Its weights without Qwen3, and the swap's float32 scratch buffers (five of its largest weight's size).
    assert placement.weights / GIB == pytest.approx(11.62, abs=0.01)
    assert placement.nbytes == placement.weights + 5 * 4 * zimage.MEMORY.largest_values
    beside = settings_for(ZIMAGE_MODEL_ID, DEFAULT_MODEL_ID)
    plan = plan_memory(needs_on_a_gpu(beside), A10G, PlanOptions.of(beside))
    assert not plan.resident and plan.host_components(ZIMAGE_MODEL_ID) == ("text_encoder",)
    assert [p.storage for p in plan.placements] == ["native", "native"]
    resident = beside.replace(pool_offload=False)
    with pytest.raises(SettingsError, match=r"or a larger GPU: L40S \(48 GB\)$"):
        plan_memory(needs_on_a_gpu(resident), A10G, PlanOptions.of(resident.replace(quantize="off")))
    # QUANTIZE=auto keeps both resident with both denoisers in fp8 (Z-Image's first, the larger).
    quantized = plan_memory(needs_on_a_gpu(resident), A10G, PlanOptions.of(resident))
    assert quantized.resident and quantized.auto_quantized == (ZIMAGE_MODEL_ID, DEFAULT_MODEL_ID)


def test_z_image_beside_sdxl_are_both_resident_on_48_gb():
    settings = settings_for(ZIMAGE_MODEL_ID, DEFAULT_MODEL_ID)
    plan = plan_memory(needs_on_a_gpu(settings), L40S, PlanOptions.of(settings))
    assert plan.resident and all(not p.host_components for p in plan.placements)
    assert sum(p.nbytes for p in plan.placements) <= plan.room


def test_qwen3_left_in_host_ram_encodes_there_and_the_image_is_the_same(loaded_zimage, tiny_zimage_dir, base_settings):
    """On the CPU both places are host RAM: this checks the hooks leave the pipeline's call and image as they were."""
    settings = base_settings.replace(model_id=str(tiny_zimage_dir), base_model_id=ZIMAGE_MODEL_ID)
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.host_components == ("text_encoder",)
    # Another pipeline than the session's, its weights in other storage: within 2 levels (tests/support/images.py).
    assert_images_close(image(hosted), image(loaded_zimage))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_qwen3_in_host_ram_gives_the_devices_image(tiny_zimage_dir, base_settings):
    settings = base_settings.replace(
        model_id=str(tiny_zimage_dir), base_model_id=ZIMAGE_MODEL_ID, device="cuda", dtype="auto"
    )
    hosted = load_pipeline(settings, host_components=("text_encoder",))
    assert hosted.pipe.text_encoder.device.type == "cpu" and hosted.pipe.transformer.device.type == "cuda"
    on_device = load_pipeline(settings)
    # Qwen3 in bf16 on the CPU and on the GPU round differently; 2 levels on 8-bit images, as elsewhere.
    assert_images_close(image(hosted), image(on_device))
