"""The start-up memory plan: the families' declared sizes, what each GPU gets, and refusals that say what fits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from engine.errors import SettingsError
from engine.families import sd2, sd15, sdxl
from engine.pools.plan import PlanOptions, PoolNeed, declared_needs, largest_values, plan_memory
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from families.sd15 import MODEL_ID as SD15_MODEL_ID

GIB = 2**30
# A host that holds whatever a plan places there: these tests judge the GPU side (the host side: test_hostplan).
HOST_RAM = 2**40
# What torch reports for these GPUs' memory.
A10G = 23_028 * 2**20
T4 = 15_095 * 2**20
RTX_12GB = 12_042 * 2**20
L40S = 46_068 * 2**20

# The published configs' fields that differ from diffusers' and transformers' defaults: the unet/, vae/ and
# text_encoder*/ config.json of each base.
_UNET_SD15 = {
    "block_out_channels": (320, 640, 1280, 1280),
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 768,
}
_UNETS = {
    "sdxl": {
        "block_out_channels": (320, 640, 1280),
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        "attention_head_dim": (5, 10, 20),
        "transformer_layers_per_block": (1, 2, 10),
        "use_linear_projection": True,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816,
        "cross_attention_dim": 2048,
    },
    "sd15": _UNET_SD15,
    "sd2": {
        **_UNET_SD15,
        "attention_head_dim": (5, 10, 20, 20),
        "cross_attention_dim": 1024,
        "use_linear_projection": True,
    },
}
_CLIP = {"vocab_size": 49408, "max_position_embeddings": 77}
_CLIP_L = CLIPTextConfig(**_CLIP, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
_CLIP_G = CLIPTextConfig(
    **_CLIP,
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=20,
    projection_dim=1280,
    hidden_act="gelu",
)
_CLIP_H = CLIPTextConfig(
    **_CLIP, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16, hidden_act="gelu"
)
_VAE = {
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
}


def values(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()))


@pytest.mark.parametrize("family", ["sdxl", "sd15", "sd2"])
def test_declared_sizes_are_what_diffusers_and_transformers_build_from_the_published_configs(family):
    with torch.device("meta"):
        built = {"unet": UNet2DConditionModel(**_UNETS[family]), "vae": AutoencoderKL(**_VAE)}
        if family == "sdxl":
            built |= {"text_encoder": CLIPTextModel(_CLIP_L), "text_encoder_2": CLIPTextModelWithProjection(_CLIP_G)}
        else:
            built["text_encoder"] = CLIPTextModel(_CLIP_L if family == "sd15" else _CLIP_H)
    spec = {"sdxl": sdxl, "sd15": sd15, "sd2": sd2}[family].FAMILY
    assert dict(spec.memory.values) == {name: values(module) for name, module in built.items()}
    # The largest weight a LoRA may touch sizes the swap's float32 scratch buffers on the device.
    assert spec.memory.largest_values == largest_values([built[c] for c in spec.components])


def fp16(*pools: str, **changes: object) -> Settings:
    return Settings(dtype="float16", device="cpu", pools=tuple(PoolSetting(p, p) for p in pools)).replace(
        **{"host_ram_bytes": HOST_RAM, **changes}
    )


def plan_for(settings: Settings, total: int):
    needs = declared_needs(settings, torch.device("cpu"))
    assert needs is not None
    return plan_memory(needs, total, PlanOptions.of(settings))


def test_sdxl_and_sd15_stay_resident_on_an_a10g_with_the_pristine_copies_that_fit_beside_them():
    """Issue 20, defect 10a: counting both pools' pristine copies on the device they need about 23 GiB."""
    settings = fp16(DEFAULT_MODEL_ID, SD15_MODEL_ID)
    plan = plan_for(settings, A10G)
    assert plan.resident
    assert sum(p.nbytes for p in plan.placements) <= plan.room <= A10G - 8 * GIB
    # SDXL's pristine copies (up to 6.3 GiB) do not fit beside both pipelines: they wait in host RAM, SD 1.5's fit.
    assert [p.pristine_store for p in plan.placements] == ["cpu", "device"]
    # Unless fewer are kept: the plan names the largest PRISTINE_BYTES (in 256 MiB steps) with which SDXL's fit too.
    fewer = plan.smaller_pristine
    assert fewer is not None and f"PRISTINE_BYTES={fewer // 2**20}MiB would keep every pool" in plan.describe()
    smaller = plan_for(settings.replace(pristine_bytes=fewer), A10G)
    assert smaller.resident and [p.pristine for p in smaller.placements] == [fewer, sd15_touchable()]
    larger = plan_for(settings.replace(pristine_bytes=fewer + 256 * 2**20), A10G)
    assert "cpu" in [p.pristine_store for p in larger.placements]
    with pytest.raises(SettingsError):
        plan_for(settings.replace(pristine_store="device", pool_offload=False, quantize="off"), A10G)
    # QUANTIZE=auto (the default) fits that by storing the larger denoiser, SDXL's, in fp8 (no copies of it).
    quantized = plan_for(settings.replace(pristine_store="device", pool_offload=False), A10G)
    assert quantized.resident and quantized.auto_quantized == (DEFAULT_MODEL_ID,)
    assert [quantized.storage(n) for n in (DEFAULT_MODEL_ID, SD15_MODEL_ID)] == ["fp8", "native"]
    turns = plan_for(settings.replace(pristine_store="device"), A10G)
    assert not turns.resident and [p.pristine_store for p in turns.placements] == ["device", "device"]
    assert [p.storage for p in (*plan.placements, *turns.placements)] == ["native"] * 4


def sd15_touchable() -> int:
    return 2 * sd15.MEMORY.values_of(sd15.FAMILY.components)


def test_sdxl_on_a_t4_keeps_its_pristine_copies_in_host_ram():
    (placement,) = plan_for(fp16(DEFAULT_MODEL_ID), T4).placements
    # 6.62 GiB: its VAE is kept in float32.
    assert placement.pristine_store == "cpu" and placement.weights == pytest.approx(6.62 * GIB, rel=0.01)


def test_sdxl_on_a_12_gb_gpu_is_refused_naming_what_would_fit_but_in_int4():
    """Issue 20, defect 6: the refusal comes at start-up, with the adapter cache that fits and the GPU that does."""
    with pytest.raises(SettingsError) as refused:
        plan_for(fp16(DEFAULT_MODEL_ID, quantize="off"), RTX_12GB)
    message = str(refused.value)
    assert "the pools do not fit this GPU's 11.76 GiB" in message
    assert f"{DEFAULT_MODEL_ID} 6.62 GiB (its pristine copies up to 6.31 GiB)" in message
    # Its weights and the swap's scratch buffers outgrow what is left beside the CUDA context and one pool's
    # working memory, whatever the adapter cache: a T4, its UNet quantized, or in fp8 with a smaller adapter cache.
    assert message.endswith(
        "accepted: QUANTIZE=auto (denoisers in int4 where needed, LoRAs as branches beside them); or a larger GPU: "
        "T4 (16 GB)"
    )
    with pytest.raises(SettingsError) as refused:
        plan_for(fp16(DEFAULT_MODEL_ID, quantize="fp8"), RTX_12GB)
    message = str(refused.value)
    assert f"{DEFAULT_MODEL_ID} 5.19 GiB (denoiser in fp8) (its pristine copies up to 1.52 GiB)" in message
    assert message.endswith(
        "QUANTIZE=fp8; accepted: QUANTIZE=auto (denoisers in int4 where needed, LoRAs as branches beside them); or "
        "DEVICE_CACHE_BYTES=1536MiB; or a larger GPU: T4 (16 GB)"
    )
    smaller_cache = plan_for(fp16(DEFAULT_MODEL_ID, device_cache_bytes=1536 * 2**20), RTX_12GB)
    assert smaller_cache.storage(DEFAULT_MODEL_ID) == "fp8"
    # QUANTIZE=auto with the default cache: the smallest storage, int4.
    assert plan_for(fp16(DEFAULT_MODEL_ID), RTX_12GB).storage(DEFAULT_MODEL_ID) == "int4"


def test_with_offloading_off_the_refusal_names_the_pools_and_the_settings_that_fit():
    settings = fp16(DEFAULT_MODEL_ID, SD15_MODEL_ID, pool_offload=False, pristine_store="device", quantize="off")
    with pytest.raises(SettingsError) as refused:
        plan_for(settings, A10G)
    message = str(refused.value)
    assert "POOL_OFFLOAD=off, PRISTINE_STORE=device and QUANTIZE=off" in message
    assert f"accepted: MODELS with {DEFAULT_MODEL_ID} and {SD15_MODEL_ID} only" not in message
    assert f"accepted: MODELS with {DEFAULT_MODEL_ID} only (these fit here); or POOL_OFFLOAD=on;" in message
    assert message.endswith("a larger GPU: L40S (48 GB)")


# FLUX.1 [dev] in bf16 (its transformer/ and text_encoder_2/ configs): a transformer of 11.9 billion values, T5-XXL's
# encoder of 4.76 billion, CLIP-L and the VAE; a FLUX family module will declare these.
FLUX = PoolNeed(
    "black-forest-labs/FLUX.1-dev",
    weights=2 * (11_901_408_320 + 4_762_310_656 + 123_060_557 + 83_819_683),
    touchable=2 * (11_901_408_320 + 123_060_557),
    host_able=(("text_encoder_2", 2 * 4_762_310_656),),
)


def test_a_family_s_host_components_are_left_in_host_ram_only_when_nothing_else_fits():
    # PRISTINE_BYTES=auto: copies for a LoRA touching all of FLUX's transformer do not fit beside it on 48 GB, so
    # they wait in host RAM (the plan names a PRISTINE_BYTES that would keep them on the device).
    auto = plan_memory([FLUX], L40S, PlanOptions.of(fp16(DEFAULT_MODEL_ID)))
    assert auto.placements[0].host_components == () and auto.placements[0].pristine_store == "cpu"
    assert auto.smaller_pristine is not None
    assert auto.smaller_pristine is not None
    options = PlanOptions.of(fp16(DEFAULT_MODEL_ID, pristine_bytes=auto.smaller_pristine))
    (alone,) = plan_memory([FLUX], L40S, options).placements
    assert alone.host_components == () and alone.pristine_store == "device"
    sdxl_need = declared_needs(fp16(DEFAULT_MODEL_ID), torch.device("cpu"))
    assert sdxl_need is not None
    beside = plan_memory([FLUX, *sdxl_need], L40S, options)
    assert not beside.resident and all(p.host_components == () for p in beside.placements)
    resident = plan_memory([FLUX, *sdxl_need], L40S, dataclasses.replace(options, offload=False))
    assert resident.resident and resident.placement(FLUX.name).host_components == ("text_encoder_2",)
    with pytest.raises(SettingsError, match=r"accepted: a larger GPU: L40S \(48 GB\)$"):
        plan_memory([FLUX], A10G, options)


def test_a_plan_that_cannot_fit_is_refused_before_anything_loads():
    loads: list[Settings] = []
    settings = fp16(DEFAULT_MODEL_ID, SD15_MODEL_ID)
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    with pytest.raises(SettingsError, match=r"the pools do not fit this GPU's 11\.76 GiB"):
        build_pools(settings, resolver, lambda s, **_: loads.append(s), warm=False, memory=lambda _: RTX_12GB)
    assert loads == []


def test_a_lone_loaded_pool_larger_than_the_gpu_is_refused_at_start_up(loaded, base_settings):
    """Issue 20, defect 6, for a pipeline whose size is known only once loaded (a local folder)."""
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    settings = base_settings.replace(local_lora_dir=None)
    tight = 4 * GIB + settings.device_cache_bytes + 2**20
    with pytest.raises(SettingsError, match=r"the pools do not fit this GPU's 4\.06 GiB.*a larger GPU: T4"):
        build_pools(settings, resolver, lambda s, **_: loaded, warm=False, memory=lambda _: tight)


def test_loading_leaves_the_plan_s_host_components_in_host_ram_and_out_of_the_moves(base_settings, monkeypatch):
    from engine.pipeline import loading
    from engine.pools.plan import pipeline_modules

    with pytest.raises(SettingsError, match=r"cannot run text_encoder_2 from host RAM; accepted: none of its"):
        loading.load_pipeline(base_settings, warm=False, host_components=("text_encoder_2",))
    # A family that declares it can run its second text encoder from host RAM (as FLUX's T5 will be).
    family = dataclasses.replace(
        sdxl.FAMILY, memory=dataclasses.replace(sdxl.MEMORY, host_components=("text_encoder_2",))
    )
    monkeypatch.setattr(loading, "family_spec", lambda *_, **__: family)
    loaded = loading.load_pipeline(base_settings, warm=False, host_components=("text_encoder_2",))
    assert loaded.host_components == ("text_encoder_2",)
    moved = pipeline_modules(loaded)
    assert loaded.pipe.text_encoder_2 not in moved and loaded.pipe.unet in moved and loaded.pipe.vae in moved
