"""int4 in the memory plan (issue 43): the one int4 formula (`engine.storage.int4_bytes`) against each family's
reference denoiser built on the meta device, linear by linear as `engine.weights.int4` stores it; QUANTIZE=auto
takes the smallest storage that fits, native, then fp8, then int4, and a refusal names the storage that would fit.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import QwenImageTransformer2DModel
from torch import nn

from engine.errors import SettingsError
from engine.families import flux, qwen_image, sd2, sd15, sdxl, zimage
from engine.pools.plan import PlanOptions, PoolNeed, plan_memory
from engine.settings import PoolSetting, Settings
from engine.storage import BRANCH_BYTES, GROUP_BYTES, OTHER_BYTES, int4_bytes
from families.flux import MODEL_ID as FLUX_MODEL_ID
from tests.engine.pools.test_plan_quantized import _built
from tests.engine.pools.test_plan_qwen_image import _TRANSFORMER as _QWEN_TRANSFORMER
from tests.support.dit import needs_on_a_gpu

GIB = 2**30
RANK = 128
SPECS = {"flux": flux, "zimage": zimage, "sdxl": sdxl, "sd15": sd15, "sd2": sd2, "qwen_image": qwen_image}


def stored_int4(denoiser: nn.Module, group_size: int, rank: int) -> tuple[int, int]:
    """(bytes, bytes of the linears kept in bf16) of `denoiser` as `quantize_denoiser_int4` stores it: a linear
    whose input the group divides and whose outputs are a multiple of 16 in codes, scales and zeros; any other in
    bf16; every other value in bf16; a branch of `rank` beside every linear."""
    total = kept = 0
    linear_values = 0
    for module in denoiser.modules():
        if not isinstance(module, nn.Linear):
            continue
        out, inp = module.out_features, module.in_features
        linear_values += out * inp
        total += rank * (out + inp) * BRANCH_BYTES
        if inp % group_size == 0 and out % 16 == 0:
            total += out * inp // 2 + out * (inp // group_size) * GROUP_BYTES
        else:
            total += out * inp * OTHER_BYTES
            kept += out * inp * OTHER_BYTES
    values = sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()))
    return total + (values - linear_values) * OTHER_BYTES, kept


def meta_denoiser(family: str) -> nn.Module:
    if family == "qwen_image":
        with torch.device("meta"):
            return QwenImageTransformer2DModel(**_QWEN_TRANSFORMER)
    return _built(family)[0]


@pytest.mark.parametrize("family", list(SPECS))
@pytest.mark.parametrize("group_size", [64, 128])
def test_the_int4_formula_is_what_the_meta_device_models_store_but_their_narrow_linears(family, group_size):
    denoiser = meta_denoiser(family)
    memory = SPECS[family].FAMILY.memory
    assert memory.linears is not None
    values = sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()))
    formula = int4_bytes(values, memory.linears, RANK, group_size)
    exact, kept = stored_int4(denoiser, group_size, RANK)
    # The formula counts every linear in int4: it is short by the kept linears' bf16 less their int4 size, and
    # only by that (its branches count the family's `branch_modules`, every linear of these denoisers).
    assert formula <= exact <= formula + kept
    if family not in ("sdxl", "sd15", "sd2"):  # the DiTs: widths in multiples of 128 but their input embedders
        assert exact - formula < 0.001 * exact


def pool(name: str, native: int, fp8: int, int4: int) -> PoolNeed:
    """A pool of `native` bytes whose denoiser (all of them) takes `fp8` or `int4` bytes quantized."""
    need = PoolNeed(name, native, native, working=GIB)
    return need.with_fp8(native, fp8, 0, 0).with_int4(native, int4, 0, 0)


def options(**changes: object) -> PlanOptions:
    """No adapter cache, no bound on host RAM, POOL_OFFLOAD=on unless `changes` say otherwise."""
    return PlanOptions(
        **{"pristine_bytes": None, "pristine_store": "auto", "offload": True, "adapter_cache": 0, **changes}
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("total_gib", "storage"), [(30, "native"), (20, "fp8"), (12, "int4")], ids=["native", "fp8", "int4"]
)
def test_auto_takes_the_smallest_storage_that_fits_native_then_fp8_then_int4(total_gib, storage):
    need = pool("big", 24 * GIB, 12 * GIB, 6 * GIB)
    plan = plan_memory([need], total_gib * GIB, options())
    assert plan.storage("big") == storage
    assert plan.auto_quantized == (() if storage == "native" else ("big",))


def test_auto_puts_back_in_fp8_a_pool_that_fits_so_beside_an_int4_one():
    """The int4 tier is reached with every pool in fp8; a pool that fits in fp8 beside the int4 one keeps fp8."""
    big, small = pool("big", 24 * GIB, 12 * GIB, 6 * GIB), pool("small", 8 * GIB, 4 * GIB, 2 * GIB)
    plan = plan_memory([big, small], 13 * GIB, options(offload=False))
    assert plan.resident and [plan.storage("big"), plan.storage("small")] == ["int4", "fp8"]
    plan = plan_memory([big, small], 19 * GIB, options(offload=False))
    assert [plan.storage("big"), plan.storage("small")] == ["fp8", "fp8"]


def test_a_refusal_names_the_storage_that_would_fit():
    need = pool("big", 24 * GIB, 12 * GIB, 6 * GIB)
    with pytest.raises(SettingsError, match=r"QUANTIZE=off; accepted: QUANTIZE=auto \(denoisers in int4 where"):
        plan_memory([need], 12 * GIB, options(quantize="off"))
    fixed = options(pool_quantize=(("big", "fp8"),))
    with pytest.raises(SettingsError, match=r"accepted: QUANTIZE=int4 for big \(QUANTIZE=int4, or its MODELS item "):
        plan_memory([need], 12 * GIB, fixed)
    with pytest.raises(SettingsError, match=r"\(denoiser in int4\).*; accepted: a larger GPU: T4 \(16 GB\)$"):
        plan_memory([need], 6 * GIB, options())


def test_flux1_dev_in_int4_by_its_models_item_is_planned_in_int4_on_a_t4():
    settings = Settings.from_env({"MODELS": f"{FLUX_MODEL_ID}:int4"}).replace(device="cpu")
    assert settings.pool_settings == (PoolSetting(FLUX_MODEL_ID, FLUX_MODEL_ID, "int4"),)
    plan = plan_memory(needs_on_a_gpu(settings), 15_095 * 2**20, PlanOptions.of(settings))
    assert plan.storage(FLUX_MODEL_ID) == "int4" and plan.auto_quantized == ()
