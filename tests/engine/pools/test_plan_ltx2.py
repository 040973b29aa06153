"""LTX-2 in the start-up memory plan: the declared sizes are what diffusers and transformers build from LTX-2's
structure (diffusers' defaults for the transformer, connectors, VAEs and vocoder; Gemma 3 12B's config); the
working memory follows the latent shape; which GPUs serve it (bf16 on 80 GB, int4 with Gemma in host RAM on an
L40S, none on 24 GB) and in which storage."""

from __future__ import annotations

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
