"""LTX-2 in the start-up memory plan: the declared sizes are what diffusers and transformers build from LTX-2's
structure (diffusers' defaults for the transformer, connectors, VAEs and vocoder; Gemma 3 12B's config); the
working memory follows the latent shape; which GPUs serve it (bf16 on 80 GB, int4 with Gemma in host RAM on an
L40S, none on 24 GB) and in which storage; a GGUF file of its transformer (a `MODELS` item `MODEL@FILE.gguf`) is
planned by its type: Q4_K on 80 GB and on an L40S, a larger type refused there naming the one that fits, and none on
24 GB, naming the GPU that serves it."""

from __future__ import annotations

import huggingface_hub
import pytest
import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from torch import nn
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from engine.errors import SettingsError
from engine.families import ltx2, ltx2_memory
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.settings import PoolSetting, Settings
from engine.storage import linear_sizes
from families.ltx2 import MODEL_ID
from tests.support.dit import A10G, HOST_RAM, L40S, needs_on_a_gpu, values

A100 = 81_038 * 2**20
# GGUF files of LTX-2 19B's transformer as `MODELS` items (the repo and file names are illustrative, as
# bench/plan_table's: the plan reads only the quant type in the name; nothing is fetched).
GGUF_Q4_K = f"{MODEL_ID}@someone/LTX-2-GGUF/ltx-2-19b-Q4_K_M.gguf"
GGUF_Q8_0 = f"{MODEL_ID}@someone/LTX-2-GGUF/ltx-2-19b-Q8_0.gguf"
# google/gemma-3-12b-it's config (LTX-2's text_encoder/).
_GEMMA = Gemma3Config(
    text_config={
        "vocab_size": 262208,
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
    },
    vision_config={
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "image_size": 896,
        "patch_size": 14,
    },
    mm_tokens_per_image=256,
)


def test_declared_sizes_are_what_diffusers_and_transformers_build_for_ltx2():
    memory = ltx2.FAMILY.memory_of(MODEL_ID)
    with torch.device("meta"):
        transformer, connectors = LTX2VideoTransformer3DModel(), LTX2TextConnectors()
        built = {
            "transformer": transformer,
            "text_encoder": Gemma3ForConditionalGeneration(_GEMMA),
            "connectors": connectors,
            "vae": AutoencoderKLLTX2Video(),
            "audio_vae": AutoencoderKLLTX2Audio(),
            "vocoder": LTX2Vocoder(),
        }
    assert dict(memory.values) == {name: values(module) for name, module in built.items()}
    assert head_width(transformer) == 4096 and transformer.config.num_layers == 48
    assert memory.largest_values == largest_values([transformer])
    assert memory.largest_encoder_values == largest_values([connectors])
    linears = [(n, m.out_features, m.in_features) for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    assert memory.linears == linear_sizes(linears, None)
    assert memory.host_components == ("text_encoder",) and "text_encoder" not in ltx2.FAMILY.components


def head_width(transformer: nn.Module) -> int:
    config = transformer.config  # type: ignore[attr-defined]
    return int(config.num_attention_heads) * int(config.attention_head_dim)


def test_video_tokens_follow_the_latent_shape_and_the_plan_bounds_the_cards_clip():
    """(n - 1) / 8 + 1 latent frames of H/32 x W/32, one token each (1x1x1 patches); the card's 121 frames at
    768 x 512 are 16 x 16 x 24 tokens, and the decode outweighs the step there."""
    assert ltx2_memory.tokens(121, 768, 512) == 16 * 16 * 24
    assert ltx2_memory.decode_bytes(121, 768, 512) > ltx2_memory.step_bytes(121, 768, 512)
    memory = ltx2.FAMILY.memory
    assert memory.video_size == (121, 768, 512) and memory.largest_side == 1024
    assert memory.working_bytes >= ltx2_memory.decode_bytes(121, 768, 512)


def settings_for(*models: str, **changes: object) -> Settings:
    return Settings(dtype="auto", device="cpu", pools=tuple(PoolSetting(m, m) for m in models)).replace(
        **{"host_ram_bytes": HOST_RAM, **changes}
    )


def plan(settings: Settings, total: int):
    return plan_memory(needs_on_a_gpu(settings), total, PlanOptions.of(settings))


def test_bf16_on_80_gb_int4_with_gemma_in_host_ram_on_an_l40s_and_none_on_24_gb():
    (native,) = plan(settings_for(MODEL_ID), A100).placements
    assert native.storage == "native"
    (l40s,) = plan(settings_for(MODEL_ID), L40S).placements
    assert l40s.storage == "int4" and l40s.host_components == ("text_encoder",)
    with pytest.raises(SettingsError, match=r"A100 or H100 \(80 GB\)"):
        plan(settings_for(MODEL_ID, quantize="off"), L40S)
    with pytest.raises(SettingsError, match=r"L40S \(48 GB\)"):
        plan(settings_for(MODEL_ID), A10G)
    (fp8,) = plan(settings_for(MODEL_ID, quantize="fp8"), A100).placements
    assert fp8.storage == "fp8"


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """No Hub file cached: a Hub GGUF is planned by its name."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def gguf_settings(models: str) -> Settings:
    return Settings.from_env({"MODELS": models}).replace(device="cpu", host_ram_bytes=HOST_RAM)


def test_a_gguf_transformer_is_planned_by_its_type_on_80_gb_and_an_l40s_and_none_fits_24_gb(empty_hub_cache):
    settings = gguf_settings(GGUF_Q4_K)
    (need,) = needs_on_a_gpu(settings)
    (plain,) = needs_on_a_gpu(settings_for(MODEL_ID))
    assert (need.storage, need.quant) == ("gguf", "Q4_K") and need.fp8 is None and need.int4 is None
    assert plain.int4 is not None and plain.fp8 is not None
    # Q4_K's 4.5 bits a value fall between int4's and fp8's; Gemma, the VAEs and the vocoder as they are.
    assert plain.int4.weights < need.weights < plain.fp8.weights
    (large,) = plan(settings, A100).placements
    assert (large.storage, large.host_components) == ("gguf", ())
    (l40s,) = plan(settings, L40S).placements
    assert (l40s.storage, l40s.host_components) == ("gguf", ("text_encoder",))
    assert "(denoiser in gguf Q4_K with LoRA branches)" in plan(settings, L40S).describe()
    # QUANTIZE=auto never re-stores a GGUF pool; on 24 GB nothing fits: the refusal names the GPU that does.
    with pytest.raises(SettingsError, match=r"gguf Q4_K.*accepted: a larger GPU: L40S \(48 GB\)"):
        plan(settings, A10G)


def test_a_larger_gguf_type_on_an_l40s_is_refused_naming_the_type_that_fits(empty_hub_cache):
    settings = gguf_settings(GGUF_Q8_0)
    (need,) = needs_on_a_gpu(settings)
    (placement,) = plan(settings, A100).placements
    assert placement.storage == "gguf"
    with pytest.raises(SettingsError, match=r"accepted: a GGUF file of type (\w+) for Lightricks/LTX-2") as e:
        plan(settings, L40S)
    said = str(e.value).split("a GGUF file of type ")[1].split(" ")[0]
    (fits,) = plan_memory([n for n in need.smaller if n.quant == said], L40S, PlanOptions.of(settings)).placements
    assert fits.storage == "gguf" and fits.host_components == ("text_encoder",)
