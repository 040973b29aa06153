"""FLUX.1 in the start-up memory plan: its declared sizes are FLUX.1 [dev]'s, it does not fit a 24 GB GPU beside
SDXL (nor alone) and the refusal says what would, it fits 48 GB; its T5 encoder, when the plan leaves it in host
RAM, encodes prompts there and gives the image it gives on the device."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from engine.errors import SettingsError
from engine.families import flux
from engine.pipeline.loading import load_pipeline
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from families.flux import MODEL_ID as FLUX_MODEL_ID
from tests.support.dit import A10G, FLUX1_VAE, GIB, HOST_RAM, L40S, needs_on_a_gpu, values
from tests.support.dit import pipeline_image as image
from tests.support.images import assert_images_close

# black-forest-labs/FLUX.1-dev's config.json files, the fields that differ from diffusers' and transformers'
# defaults (transformer/, text_encoder/ CLIP-L, text_encoder_2/ T5-XXL; vae/: FLUX1_VAE).
_TRANSFORMER = {
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
_CLIP_L = CLIPTextConfig(
    vocab_size=49408,
    max_position_embeddings=77,
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
)
_T5_XXL = T5Config(
    vocab_size=32128,
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)


def test_declared_sizes_are_what_diffusers_and_transformers_build_from_flux1_devs_configs():
    with torch.device("meta"):
        built = {
            "transformer": FluxTransformer2DModel(**_TRANSFORMER),
            "text_encoder": CLIPTextModel(_CLIP_L),
            "text_encoder_2": T5EncoderModel(_T5_XXL),
            "vae": AutoencoderKL(**FLUX1_VAE),
        }
    assert dict(flux.FAMILY.memory.values) == {name: values(module) for name, module in built.items()}
    # The largest weight a LoRA may touch sizes the swap's float32 scratch buffers on the device.
    assert flux.FAMILY.memory.largest_values == largest_values([built[c] for c in flux.FAMILY.components])
    # T5 is the one component a LoRA never changes and the one that may stay in host RAM.
    assert flux.FAMILY.memory.host_components == ("text_encoder_2",)
    assert "text_encoder_2" not in flux.FAMILY.components


def flux_beside_sdxl(**changes: object) -> Settings:
    pools = (PoolSetting(FLUX_MODEL_ID, FLUX_MODEL_ID), PoolSetting(DEFAULT_MODEL_ID, DEFAULT_MODEL_ID))
    return Settings(dtype="auto", device="cpu", pools=pools).replace(**{"host_ram_bytes": HOST_RAM, **changes})


def test_flux1_dev_in_bf16_is_its_33_7_gb_and_t5_may_wait_in_host_ram():
    flux_need, sdxl_need = needs_on_a_gpu(flux_beside_sdxl())
    assert flux_need.weights == 2 * 16_870_599_216 and flux_need.weights / 1e9 == pytest.approx(33.74, abs=0.01)
    assert flux_need.touchable == 2 * (11_901_408_320 + 123_060_557)
    assert flux_need.host_able == (("text_encoder_2", 2 * 4_762_310_656),)
    assert sdxl_need.weights / GIB == pytest.approx(6.62, abs=0.01)  # its VAE in float32


def test_flux1_dev_beside_sdxl_in_bf16_does_not_fit_24_gb_and_the_refusal_says_what_would():
    """In native storage (QUANTIZE=off); under QUANTIZE=auto it fits: test_plan_quantized.py."""
    settings = flux_beside_sdxl(quantize="off")
    with pytest.raises(SettingsError) as refused:
        plan_memory(needs_on_a_gpu(settings), A10G, PlanOptions.of(settings))
    message = str(refused.value)
    assert "the pools do not fit this GPU's 22.49 GiB" in message
    assert f"{FLUX_MODEL_ID} 31.42 GiB (its pristine copies up to " in message
    # SDXL alone fits here; FLUX.1 needs a 48 GB GPU (its transformer alone outgrows what an A10G leaves).
    assert f"accepted: MODELS with {DEFAULT_MODEL_ID} only (these fit here); or QUANTIZE=auto" in message
    assert message.endswith("a larger GPU: L40S (48 GB)")
    with pytest.raises(SettingsError, match=r"accepted: QUANTIZE=auto \(denoisers in fp8 .*; or a larger GPU: L40S"):
        alone = settings.replace(pools=settings.pools[:1])
        plan_memory(needs_on_a_gpu(alone), A10G, PlanOptions.of(alone))


def test_flux1_dev_beside_sdxl_fits_48_gb():
    settings = flux_beside_sdxl()
    plan = plan_memory(needs_on_a_gpu(settings), L40S, PlanOptions.of(settings))
    assert [p.name for p in plan.placements] == [FLUX_MODEL_ID, DEFAULT_MODEL_ID]
    assert (sum if plan.resident else max)(p.nbytes for p in plan.placements) <= plan.room
    # Kept resident together (no offloading), T5 waits in host RAM: the only way both fit.
    resident = plan_memory(needs_on_a_gpu(settings), L40S, PlanOptions.of(settings.replace(pool_offload=False)))
    assert resident.resident and resident.host_components(FLUX_MODEL_ID) == ("text_encoder_2",)
    assert resident.host_components(DEFAULT_MODEL_ID) == ()


def flux_settings(base_settings: Settings, tiny_flux_dir, **changes: object) -> Settings:
    return base_settings.replace(model_id=str(tiny_flux_dir), base_model_id=FLUX_MODEL_ID, **changes)


def test_t5_left_in_host_ram_encodes_there_and_the_image_is_the_same(loaded_flux, tiny_flux_dir, base_settings):
    """On the CPU both places are host RAM: this checks the hooks leave the pipeline's call and image as they
    were; on a GPU (test below) they carry T5's inputs and outputs across."""
    hosted = load_pipeline(flux_settings(base_settings, tiny_flux_dir), host_components=("text_encoder_2",))
    assert hosted.host_components == ("text_encoder_2",)
    # Another pipeline than the session's, its weights in other storage: within 2 levels (tests/support/images.py).
    assert_images_close(image(hosted), image(loaded_flux))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_t5_in_host_ram_gives_the_devices_image(tiny_flux_dir, base_settings):
    settings = flux_settings(base_settings, tiny_flux_dir, device="cuda", dtype="auto")
    hosted = load_pipeline(settings, host_components=("text_encoder_2",))
    assert hosted.pipe.text_encoder_2.device.type == "cpu" and hosted.pipe.transformer.device.type == "cuda"
    on_device = load_pipeline(settings)
    # T5 in bf16 on the CPU and on the GPU round differently; 2 levels on 8-bit images, as elsewhere.
    assert_images_close(image(hosted), image(on_device))
