"""Quantized denoisers in the memory plan (issue 31): each family's fp8 sizes are what its published configs build;
`QUANTIZE=auto` stores a pool's denoiser in fp8 only where nothing else fits, the largest first; FLUX.1 [dev] on a
24 GB GPU (A10G, L4) alone and beside SDXL taking turns; a plan that still cannot fit names what would."""

from __future__ import annotations

import logging

import pytest
import torch
from diffusers import FluxTransformer2DModel, UNet2DConditionModel, ZImageTransformer2DModel
from torch import nn
from transformers import CLIPTextModel, CLIPTextModelWithProjection

from engine.errors import SettingsError
from engine.families import flux, sd2, sd15, sdxl, zimage
from engine.hostmem import default_host_budget
from engine.pipeline.loading import load_pipeline
from engine.pools.plan import CUDA_CONTEXT_BYTES, PlanOptions, largest_values, loaded_need, plan_memory
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import DEFAULT_MODEL_ID, PoolSetting, Settings
from engine.storage import linear_sizes
from families.flux import MODEL_ID as FLUX_MODEL_ID
from tests.engine.pools.test_plan import _CLIP_G, _CLIP_H, _CLIP_L, _UNETS
from tests.engine.pools.test_plan_flux import _TRANSFORMER
from tests.support.dit import A10G, L40S, needs_on_a_gpu

MIB, GB = 2**20, 10**9
L4 = 23_034 * MIB  # nvidia-smi's total for an L4 (an A10G's: 23,028 MiB)
# HOST_RAM_BYTES=auto on the Spaces that carry them: a10g-large (46 GB of RAM), l4x1 (30 GB).
A10G_LARGE_RAM = default_host_budget(46 * GB)
L4X1_RAM = default_host_budget(30 * GB)


def _built(family: str) -> tuple[nn.Module, list[nn.Module]]:
    """The family's reference denoiser and text encoders, built on the meta device from the published configs."""
    with torch.device("meta"):
        if family == "flux":
            return FluxTransformer2DModel(**_TRANSFORMER), [CLIPTextModel(_CLIP_L)]
        if family == "zimage":
            return ZImageTransformer2DModel(), []
        encoders = {"sdxl": [CLIPTextModel(_CLIP_L), CLIPTextModelWithProjection(_CLIP_G)], "sd15": [], "sd2": []}
        encoders["sd15"], encoders["sd2"] = [CLIPTextModel(_CLIP_L)], [CLIPTextModel(_CLIP_H)]
        return UNet2DConditionModel(**_UNETS[family]), encoders[family]


@pytest.mark.parametrize("family", ["flux", "zimage", "sdxl", "sd15", "sd2"])
def test_declared_fp8_sizes_are_what_the_published_configs_build(family):
    denoiser, encoders = _built(family)
    spec = {"flux": flux, "zimage": zimage, "sdxl": sdxl, "sd15": sd15, "sd2": sd2}[family].FAMILY.memory
    linears = [(n, m.out_features, m.in_features) for n, m in denoiser.named_modules() if isinstance(m, nn.Linear)]
    assert spec.linears == linear_sizes(linears, spec.branch_modules)
    # A quantized pool's LoRAs fuse into its text encoders only: their largest weight sizes the swap's scratch.
    assert spec.largest_encoder_values == largest_values(encoders)


@pytest.mark.parametrize("rank", [16, 128])
def test_a_loaded_pool_s_fp8_need_is_the_bytes_of_that_storage(loaded_flux, rank):
    """The denoiser's Linear weights in float8 e4m3 with a float32 scale per row, its other values in bf16, and bf16
    branch factors A (rank x in) and B (out x rank) for every Linear; measured on tensors torch makes."""
    need = loaded_need(loaded_flux, rank=rank)
    denoiser = loaded_flux.pipe.transformer
    linears = [m for m in denoiser.modules() if isinstance(m, nn.Linear)]
    weights = {id(m.weight) for m in linears}
    stored = sum(torch.empty_like(m.weight, dtype=torch.float8_e4m3fn).nbytes for m in linears)
    stored += sum(torch.empty(m.out_features, dtype=torch.float32).nbytes for m in linears)
    others = [t for t in (*denoiser.parameters(), *denoiser.buffers()) if id(t) not in weights]
    stored += sum(t.to(torch.bfloat16).nbytes for t in others)
    stored += sum(
        torch.empty(rank, m.in_features, dtype=torch.bfloat16).nbytes
        + torch.empty(m.out_features, rank, dtype=torch.bfloat16).nbytes
        for m in linears
    )
    denoiser_bytes = sum(t.nbytes for t in (*denoiser.parameters(), *denoiser.buffers()))
    assert need.fp8 is not None and need.fp8.storage == "fp8"
    assert need.fp8.weights == need.weights - denoiser_bytes + stored
    # Nothing of a quantized denoiser is ever written: only the text encoder's weights stay touchable.
    assert need.fp8.touchable == need.touchable - denoiser_bytes
    assert need.fp8.scratch == 5 * 4 * largest_values([loaded_flux.pipe.text_encoder])


def settings_for(*models: str, **changes: object) -> Settings:
    pools = tuple(PoolSetting(m, m) for m in models)
    return Settings(dtype="auto", device="cpu", pools=pools).replace(**{"host_ram_bytes": A10G_LARGE_RAM, **changes})


def plan_for(settings: Settings, total: int):
    return plan_memory(needs_on_a_gpu(settings), total, PlanOptions.of(settings))


@pytest.mark.parametrize("gpu", [A10G, L4], ids=["A10G", "L4"])
@pytest.mark.parametrize("ram", [A10G_LARGE_RAM, L4X1_RAM], ids=["a10g-large", "l4x1"])
def test_flux1_dev_alone_fits_24_gb_in_fp8_with_t5_in_host_ram(gpu, ram):
    settings = settings_for(FLUX_MODEL_ID, host_ram_bytes=ram)
    plan = plan_for(settings, gpu)
    (placement,) = plan.placements
    assert plan.resident and placement.nbytes <= plan.room
    assert plan.storage(FLUX_MODEL_ID) == "fp8" and plan.auto_quantized == (FLUX_MODEL_ID,)
    assert placement.host_components == ("text_encoder_2",)
    # Its CLIP's pristine copies fit on the device: the transformer has none (it is never written).
    assert placement.pristine_store == "device" and placement.pristine < GB
    assert f"QUANTIZE=auto stores {FLUX_MODEL_ID} in fp8, the only way the pools fit" in plan.describe()
    # QUANTIZE=fp8 gives the same plan, not as auto's choice; QUANTIZE=off is refused naming auto.
    forced = plan_for(settings.replace(quantize="fp8"), gpu)
    assert forced.placements == plan.placements and forced.auto_quantized == ()
    with pytest.raises(SettingsError, match=r"QUANTIZE=off; accepted: QUANTIZE=auto \(denoisers in fp8"):
        plan_for(settings.replace(quantize="off"), gpu)


@pytest.mark.parametrize("gpu", [A10G, L4], ids=["A10G", "L4"])
def test_flux1_dev_beside_sdxl_takes_turns_on_24_gb_with_only_flux_quantized(gpu):
    plan = plan_for(settings_for(FLUX_MODEL_ID, DEFAULT_MODEL_ID), gpu)
    assert not plan.resident and max(p.nbytes for p in plan.placements) <= plan.room
    assert [plan.storage(FLUX_MODEL_ID), plan.storage(DEFAULT_MODEL_ID)] == ["fp8", "native"]
    assert plan.auto_quantized == (FLUX_MODEL_ID,) and plan.host_components(FLUX_MODEL_ID) == ("text_encoder_2",)
    # SDXL alone on the device in turn keeps its pristine copies there.
    assert plan.placement(DEFAULT_MODEL_ID).pristine_store == "device"
    assert plan.host_bytes <= A10G_LARGE_RAM


def test_flux1_dev_beside_sdxl_on_an_l4x1_s_host_ram_is_refused_in_fp8_naming_what_would_fit():
    """Both pools keep a pinned buffer while they wait, and T5 stays in host RAM: more than an l4x1's 30 GB with
    FLUX.1 in fp8 (its MODELS item). Under QUANTIZE=auto it goes on to int4, which fits both resident."""
    plan = plan_for(settings_for(FLUX_MODEL_ID, DEFAULT_MODEL_ID, host_ram_bytes=L4X1_RAM), L4)
    assert plan.resident and plan.storage(FLUX_MODEL_ID) == "int4"
    models = {"MODELS": f"{FLUX_MODEL_ID}:fp8,{DEFAULT_MODEL_ID}"}
    with pytest.raises(SettingsError) as refused:
        plan_for(Settings.from_env(models).replace(device="cpu", host_ram_bytes=L4X1_RAM), L4)
    message = str(refused.value)
    assert "does not fit HOST_RAM_BYTES" in message and "HOST_RAM_BYTES of at least" in message
    assert message.endswith(f"MODELS with {FLUX_MODEL_ID} only (these fit here)")


def test_flux1_dev_beside_sdxl_both_resident_on_24_gb_is_refused_in_fp8_naming_what_would_fit():
    settings = settings_for(FLUX_MODEL_ID, DEFAULT_MODEL_ID, pool_offload=False, quantize="fp8")
    with pytest.raises(SettingsError) as refused:
        plan_for(settings, A10G)
    message = str(refused.value)
    # Both denoisers in fp8: still too large resident together; int4 (QUANTIZE=auto's last storage) would fit.
    assert f"{FLUX_MODEL_ID} 21.65 GiB (denoiser in fp8)" in message and "QUANTIZE=fp8" in message
    assert f"accepted: MODELS with {FLUX_MODEL_ID} only (these fit here); or " in message
    assert "POOL_OFFLOAD=on" in message and message.endswith("a larger GPU: L40S (48 GB)")
    plan = plan_for(settings.replace(quantize="auto"), A10G)
    assert plan.resident and plan.storage(FLUX_MODEL_ID) == "int4" and FLUX_MODEL_ID in plan.auto_quantized


def test_auto_prefers_native_storage_where_it_fits():
    # FLUX.1 beside SDXL fits a 48 GB GPU in bf16 by taking turns: nothing is quantized.
    plan = plan_for(settings_for(FLUX_MODEL_ID, DEFAULT_MODEL_ID), L40S)
    assert [p.storage for p in plan.placements] == ["native", "native"] and plan.auto_quantized == ()
    assert "QUANTIZE" not in plan.describe()


def test_a_models_item_s_quantize_rules_its_pool():
    # FLUX.1 kept native by its MODELS item does not fit 24 GB, whatever QUANTIZE says for the others.
    kept = Settings.from_env({"MODELS": f"{FLUX_MODEL_ID}:off"}).replace(device="cpu", host_ram_bytes=A10G_LARGE_RAM)
    # Its item rules it: what would fit is its item in fp8 (QUANTIZE=auto would change nothing).
    with pytest.raises(SettingsError, match=rf"QUANTIZE=off; accepted: QUANTIZE=fp8 for {FLUX_MODEL_ID} \(QUANTIZE="):
        plan_for(kept, A10G)
    # SDXL stored in fp8 by its item, beside FLUX.1 left to auto on 48 GB (where FLUX.1 stays bf16).
    models = {"MODELS": f"{FLUX_MODEL_ID},{DEFAULT_MODEL_ID}:fp8"}
    plan = plan_for(Settings.from_env(models).replace(device="cpu", host_ram_bytes=A10G_LARGE_RAM), L40S)
    assert [plan.storage(FLUX_MODEL_ID), plan.storage(DEFAULT_MODEL_ID)] == ["native", "fp8"]
    assert plan.auto_quantized == ()


def test_flux1_dev_on_a_t4_fits_only_in_int4():
    t4 = 15_095 * MIB
    plan = plan_for(settings_for(FLUX_MODEL_ID), t4)
    assert plan.storage(FLUX_MODEL_ID) == "int4" and plan.host_components(FLUX_MODEL_ID) == ("text_encoder_2",)
    with pytest.raises(
        SettingsError,
        match=r"QUANTIZE=fp8; accepted: QUANTIZE=auto \(denoisers in int4 where needed, LoRAs as branches beside "
        r"them\); or a larger GPU: A10G or L4 \(24 GB\)$",
    ):
        plan_for(settings_for(FLUX_MODEL_ID, quantize="fp8"), t4)


def test_the_loaded_plan_keeps_the_storage_the_declared_plan_chose():
    settings = settings_for(FLUX_MODEL_ID)
    needs = needs_on_a_gpu(settings)
    options = PlanOptions.of(settings)
    quantized = plan_memory(needs, A10G, options)
    assert plan_memory(needs, A10G, options.keeping(quantized.storages)).storage(FLUX_MODEL_ID) == "fp8"
    native = plan_memory(needs, L40S, options)
    assert native.storage(FLUX_MODEL_ID) == "native"
    # Kept native, it no longer fits a 24 GB GPU: the storage is never changed behind the loaded pipeline's back.
    with pytest.raises(SettingsError, match="QUANTIZE=off"):
        plan_memory(needs, A10G, options.keeping(native.storages))


@pytest.mark.parametrize(
    ("quantize", "storage"), [("auto", "native"), ("fp8", "fp8"), ("int4", "int4"), ("off", "native")]
)
def test_start_up_hands_each_pool_its_storage_and_reports_it(base_settings, caplog, quantize, storage):
    """Each pool loads in the storage decided before loading (`auto` without a plan then: native), its engine gets
    QUANTIZE resolved to it (fp8, int4 or off), and its status and start-up's log say what loaded."""
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    settings = base_settings.replace(local_lora_dir=None, quantize=quantize, host_ram_bytes=2**40, lora_max_rank=4)
    with caplog.at_level(logging.INFO, logger="engine.pools.pools"):
        pools = build_pools(settings, resolver, load_pipeline, warm=False, memory=lambda _: 64 * 2**30)
    try:
        (status,) = pools.status()
        (engine,) = [p.engine for p in pools.pools]
        assert status.engine.storage == engine.loaded.storage == storage
        assert engine.settings.quantize == ("off" if storage == "native" else storage)
    finally:
        pools.close()
    assert (f"(denoiser in {storage} with LoRA branches)" in caplog.text) == (storage != "native")
    said = f"in {storage} with LoRA branches of rank 4" if storage != "native" else "in float32"
    assert f"denoiser {said} (QUANTIZE={quantize}, no memory plan before loading)" in caplog.text


def test_auto_without_a_plan_before_loading_reports_the_native_storage_it_loaded(loaded_flux, base_settings, caplog):
    """A pool whose sizes are known only once loaded (a tiny pipeline, a local folder) loads native under
    `QUANTIZE=auto`. On a GPU where only fp8 fits, start-up used to serve it with fp8 in its status over native
    weights; it is refused, naming what would load it in fp8. Where native fits, it is served and reported native."""
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    settings = base_settings.replace(
        model_id="tiny-flux", base_model_id=FLUX_MODEL_ID, quantize="auto", lora_max_rank=1, local_lora_dir=None
    )
    settings = settings.replace(host_ram_bytes=2**40)

    def load(told, **chosen):
        assert chosen.get("storage", "native") == "native"
        return loaded_flux

    need = loaded_need(loaded_flux, rank=1)
    assert need.fp8 is not None
    room = CUDA_CONTEXT_BYTES + need.working + settings.device_cache_bytes
    # Room for the native weights, not for its swap's scratch beside them: only fp8 fits, as the plan sees it.
    only_fp8 = room + need.weights
    options = PlanOptions.of(settings)
    assert plan_memory([need], only_fp8, options).storage(FLUX_MODEL_ID) == "fp8"
    with pytest.raises(SettingsError):
        plan_memory([need], only_fp8, options.keeping([(FLUX_MODEL_ID, "native")]))
    with pytest.raises(SettingsError, match=rf"accepted: QUANTIZE=fp8 for {FLUX_MODEL_ID} \("):
        build_pools(settings, resolver, load, warm=False, memory=lambda _: only_fp8)

    native = room + need.weights + need.touchable + need.scratch
    with caplog.at_level(logging.INFO, logger="engine.pools.pools"):
        pools = build_pools(settings, resolver, load, warm=False, memory=lambda _: native)
    try:
        (status,) = pools.status()
        assert status.engine.storage == "native"
    finally:
        pools.close()
    assert f"pool {FLUX_MODEL_ID}: denoiser in float32 (QUANTIZE=auto, no memory plan before loading)" in (caplog.text)
