"""GGUF pools in the start-up memory plan (issue 43): planned before anything loads by their file's tensor types
(a local file's header, read without its tensors; a Hub file's name, or its header once cached) instead of as fp8;
never re-stored by `QUANTIZE=auto`; a refusal names the GGUF type that would fit."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import huggingface_hub
import pytest
import torch

from engine.errors import SettingsError
from engine.pools.plan import PlanOptions, plan_memory
from engine.settings import Settings
from engine.storage import bits_per_value, gguf_block
from engine.weights.gguf import planned_gguf_types
from families.flux import MODEL_ID as FLUX_MODEL_ID
from tests.support.dit import HOST_RAM, needs_on_a_gpu
from tests.support.gguf import Q, write_gguf

pytest.importorskip("gguf")

MIB = 2**20
RTX_4060_TI = 16_380 * MIB  # nvidia-smi's total for a 16 GB RTX 4060 Ti
RTX_4070 = 12_282 * MIB
HUB_Q4_K = "city96/FLUX.1-dev-gguf/flux1-dev-Q4_K_S.gguf"
HUB_Q8_0 = "city96/FLUX.1-dev-gguf/flux1-dev-Q8_0.gguf"


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path, monkeypatch):
    """No Hub file cached: a Hub GGUF is planned by its name."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def _settings(models: str, **env: str) -> Settings:
    return Settings.from_env({"MODELS": models, **env}).replace(device="cpu", host_ram_bytes=HOST_RAM)


def test_a_hub_gguf_pool_is_planned_by_the_type_its_name_says():
    (plain,) = needs_on_a_gpu(_settings(FLUX_MODEL_ID))
    (need,) = needs_on_a_gpu(_settings(f"{FLUX_MODEL_ID}@{HUB_Q4_K}"))
    assert (need.storage, need.quant) == ("gguf", "Q4_K")
    assert need.fp8 is None and need.int4 is None  # its file's storage is its only one
    assert plain.fp8 is not None and plain.int4 is not None
    # Q4_K's 4.5 bits a value fall between int4's (4.25 in groups of 128) and fp8's; never written, like them.
    assert plain.int4.weights < need.weights < plain.fp8.weights
    assert (need.touchable, need.working, need.scratch) == (plain.fp8.touchable, plain.fp8.working, plain.fp8.scratch)
    # Each smaller served type, fewest bits last, every one under the file's.
    bits = [bits_per_value(gguf_block(n.quant)) for n in need.smaller]
    assert bits == sorted(bits, reverse=True) and all(b < bits_per_value(gguf_block("Q4_K")) for b in bits)
    assert all(n.weights < need.weights for n in need.smaller)


def test_a_gguf_pool_keeps_its_file_s_storage_under_quantize_auto():
    settings = _settings(f"{FLUX_MODEL_ID}@{HUB_Q4_K}")
    plan = plan_memory(needs_on_a_gpu(settings), RTX_4060_TI, PlanOptions.of(settings))
    assert plan.storage(FLUX_MODEL_ID) == "gguf" and plan.auto_quantized == ()
    assert plan.host_components(FLUX_MODEL_ID) == ("text_encoder_2",)
    assert "(denoiser in gguf Q4_K with LoRA branches)" in plan.describe()
    # Once loaded it is planned in the storage it loaded in, as its own.
    assert PlanOptions.of(settings).keeping([(FLUX_MODEL_ID, "gguf")]).quantize_of(FLUX_MODEL_ID) == "gguf"


def test_a_refusal_names_the_gguf_type_that_would_fit():
    settings = _settings(f"{FLUX_MODEL_ID}@{HUB_Q8_0}")
    needs = needs_on_a_gpu(settings)
    with pytest.raises(
        SettingsError, match=r"accepted: a GGUF file of type Q\w+ for black-forest-labs/FLUX.1-dev"
    ) as e:
        plan_memory(needs, RTX_4060_TI, PlanOptions.of(settings))
    said = str(e.value).split("a GGUF file of type ")[1].split(" ")[0]
    # The largest type that fits: no larger served one does.
    (need,) = needs
    index = [n.quant for n in need.smaller].index(said)
    fits = plan_memory([need.smaller[index]], RTX_4060_TI, PlanOptions.of(settings))
    assert fits.storage(FLUX_MODEL_ID) == "gguf"
    for larger in need.smaller[:index]:
        with pytest.raises(SettingsError):
            plan_memory([larger], RTX_4060_TI, PlanOptions.of(settings))
    assert "QUANTIZE=gguf" not in str(e.value)


def test_a_local_gguf_file_is_sized_by_its_header(tmp_path: Path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(16, 512, generator=generator),  # Q4_K's 256-value blocks fit
        "b.weight": torch.randn(8, 96, generator=generator),  # only Q8_0's 32-value blocks fit
        "b.bias": torch.randn(8, generator=generator),  # F32
        "norm.weight": torch.randn(4, 256, generator=generator),  # kept plain, F32
    }
    path = write_gguf(tmp_path / "x.gguf", tensors, Q.Q4_K, plain=("norm.",))
    assert planned_gguf_types(str(path), tmp_path) == Counter({"Q4_K": 16 * 512, "Q8_0": 8 * 96, "F32": 8 + 4 * 256})
    # A local path outside GGUF_DIR is refused before anything loads, as at loading.
    with pytest.raises(SettingsError, match="outside the allowed places"):
        planned_gguf_types(str(path), tmp_path / "elsewhere")
    settings = _settings(f"{FLUX_MODEL_ID}@{path}", GGUF_DIR=str(tmp_path))
    (need,) = needs_on_a_gpu(settings)
    assert (need.storage, need.quant) == ("gguf", "Q4_K, Q8_0")


@pytest.mark.parametrize("models", [f"{FLUX_MODEL_ID}:int4", f"{FLUX_MODEL_ID}@{HUB_Q4_K}"], ids=["int4", "q4_k"])
def test_flux1_on_a_12_gb_gpu_is_refused_naming_the_branch_rank_and_cache_that_fit(models):
    """FLUX.1 quantized does not fit a 12 GB GPU beside the working memory and the 2 GiB adapter cache with branch
    buffers of rank 128 (1.3 GiB); the refusal names the largest LORA_MAX_RANK (with a DEVICE_CACHE_BYTES) with
    which it does, and with those it fits."""
    settings = _settings(models)
    with pytest.raises(
        SettingsError, match=r"accepted: LORA_MAX_RANK=(\d+) \(.*\) with DEVICE_CACHE_BYTES=(\d+)MiB"
    ) as e:
        plan_memory(needs_on_a_gpu(settings), RTX_4070, PlanOptions.of(settings))
    said = re.search(r"LORA_MAX_RANK=(\d+) \(.*\) with DEVICE_CACHE_BYTES=(\d+)MiB", str(e.value))
    assert said is not None
    rank, cache = (int(v) for v in said.groups())
    smaller = settings.replace(lora_max_rank=rank, device_cache_bytes=cache * MIB)
    plan = plan_memory(needs_on_a_gpu(smaller), RTX_4070, PlanOptions.of(smaller))
    assert plan.host_components(FLUX_MODEL_ID) == ("text_encoder_2",)
    if rank < 64:  # and not with twice the rank
        larger = settings.replace(lora_max_rank=2 * rank, device_cache_bytes=cache * MIB)
        with pytest.raises(SettingsError):
            plan_memory(needs_on_a_gpu(larger), RTX_4070, PlanOptions.of(larger))
