"""Krea 2 in the start-up memory plan: its declared sizes are what diffusers and transformers build from its published
configs (17.4 billion values, 34.8 GB in bf16). On a 24 GB GPU (A10G) bf16 never fits, even with Qwen3-VL in host
RAM; `QUANTIZE=auto` stores its transformer in fp8 there, `QUANTIZE=int4` and a GGUF file in theirs; on an L40S
(48 GB) it is served in bf16, everything resident, and in each quantized storage when asked."""

from __future__ import annotations

import huggingface_hub
import pytest
import torch
from diffusers import AutoencoderKLQwenImage, Krea2Transformer2DModel
from torch import nn
from transformers import Qwen3VLConfig, Qwen3VLModel

from engine.errors import SettingsError
from engine.families import krea2
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import Settings
from engine.storage import linear_sizes
from families.krea2 import MODEL_ID
from tests.support.dit import A10G, HOST_RAM, L40S, needs_on_a_gpu, values

# Qwen/Qwen3-VL-4B-Instruct's config.json, the fields that differ from transformers' defaults (Krea 2's
# text_encoder/; its transformer/ is diffusers' Krea2Transformer2DModel defaults, its vae/ Qwen-Image's).
_QWEN3_VL_4B = Qwen3VLConfig(
    text_config={
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    },
    vision_config={
        "depth": 24,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "out_hidden_size": 2560,
        "patch_size": 16,
        "deepstack_visual_indexes": [5, 11, 17],
        "num_position_embeddings": 2304,
    },
    tie_word_embeddings=True,
)
# A Q4_K GGUF file of Krea 2 Turbo as a `MODELS` item (the repo and file names are illustrative, as bench/plan_table's:
# the plan reads only the quant type in the name; nothing is fetched).
GGUF_Q4_K = f"{MODEL_ID}@someone/Krea-2-Turbo-GGUF/krea-2-turbo-Q4_K_M.gguf"


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path, monkeypatch):
    """No Hub file cached: a Hub GGUF is planned by its name."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_declared_sizes_are_what_diffusers_and_transformers_build_from_krea2s_configs():
    with torch.device("meta"):
        built = {
            "transformer": Krea2Transformer2DModel(),
            "text_encoder": Qwen3VLModel(_QWEN3_VL_4B),
            "vae": AutoencoderKLQwenImage(),
        }
    memory = krea2.FAMILY.memory
    assert dict(memory.values) == {name: values(module) for name, module in built.items()}
    assert memory.largest_values == largest_values([built[c] for c in krea2.FAMILY.components])
    assert memory.host_components == ("text_encoder",) and "text_encoder" not in krea2.FAMILY.components
    transformer = built["transformer"]
    linears = [(n, m.out_features, m.in_features) for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    assert memory.linears == linear_sizes(linears, memory.branch_modules)
    # The real model is as wide as its row's widths say.
    assert transformer.config.num_attention_heads * transformer.config.attention_head_dim in krea2.WIDTHS


def _plan(models: str, total: int, **env: str):
    settings = Settings.from_env({"MODELS": models, **env}).replace(device="cpu", host_ram_bytes=HOST_RAM)
    return plan_memory(needs_on_a_gpu(settings), total, PlanOptions.of(settings))


def test_in_bf16_krea2_needs_more_than_24_gb_and_fits_an_l40s_resident():
    (need,) = needs_on_a_gpu(Settings(dtype="auto", device="cpu").replace(model_id=MODEL_ID, base_model_id=MODEL_ID))
    assert need.weights == 2 * krea2.MEMORY.total_values
    with pytest.raises(SettingsError, match=r"the pools do not fit this GPU's 22\.49 GiB"):
        _plan(MODEL_ID, A10G, QUANTIZE="off")
    (placement,) = _plan(MODEL_ID, L40S, QUANTIZE="off").placements
    assert (placement.storage, placement.host_components) == ("native", ())
    # QUANTIZE=auto keeps bf16 where it fits.
    assert [p.storage for p in _plan(MODEL_ID, L40S).placements] == ["native"]


@pytest.mark.parametrize(
    ("models", "env", "storage"),
    [
        (MODEL_ID, {}, "fp8"),
        (MODEL_ID, {"QUANTIZE": "fp8"}, "fp8"),
        (MODEL_ID, {"QUANTIZE": "int4"}, "int4"),
        (GGUF_Q4_K, {}, "gguf"),
    ],
    ids=["auto", "fp8", "int4", "gguf-q4_k"],
)
def test_on_24_gb_and_on_an_l40s_krea2_is_served_in_each_quantized_storage(models, env, storage):
    (small,) = _plan(models, A10G, **env).placements
    # On 24 GB its Qwen3-VL waits in host RAM.
    assert (small.storage, small.host_components) == (storage, ("text_encoder",)) and small.nbytes < A10G
    if env or storage == "gguf":
        (large,) = _plan(models, L40S, **env).placements
        assert (large.storage, large.host_components) == (storage, ())
