"""Wan in the start-up memory plan: the declared sizes are what diffusers and transformers build from each model's
configs; the working memory follows the latent shape; which GPUs serve each base."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from torch import nn
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection, UMT5Config, UMT5EncoderModel

from engine.errors import LimitExceededError, SettingsError
from engine.families import wan, wan22, wan22_i2v, wan_i2v, wan_memory
from engine.normalise import normalise_request
from engine.pools.needs import paused_bytes
from engine.pools.plan import PlanOptions, largest_values, plan_memory
from engine.requests import MIN_SIDE, GenerateRequest, Limits, ModelDefaults
from engine.settings import PoolSetting, Settings
from engine.storage import linear_sizes
from families.wan import MODEL_ID, MODEL_ID_5B, MODEL_ID_14B
from families.wan22 import MODEL_ID as A14B
from families.wan22_i2v import MODEL_ID as I2V_A14B
from families.wan_i2v import MODEL_ID as I2V_480P
from families.wan_i2v import MODEL_ID_720P as I2V_720P
from tests.support.dit import A10G, HOST_RAM, L40S, needs_on_a_gpu, values

A100 = 81_038 * 2**20
# The transformer/config.json fields of each model that differ from diffusers' defaults (which are 14B T2V's).
_TRANSFORMERS = {
    MODEL_ID: {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
    MODEL_ID_14B: {},
    MODEL_ID_5B: {"num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30, "in_channels": 48, "out_channels": 48},
    I2V_480P: {"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120},
    # Wan 2.2 I2V-A14B's transformer/ and transformer_2/: the image latents' channels, no image layers.
    I2V_A14B: {"in_channels": 36},
}
_FAMILIES = {I2V_480P: wan_i2v.FAMILY, I2V_A14B: wan22_i2v.FAMILY}
# Wan 2.2's VAE (TI2V-5B's vae/config.json); Wan 2.1's is diffusers' default.
_VAE_22 = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
}
_UMT5 = UMT5Config(
    vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu"
)
_CLIP = CLIPVisionConfig(
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=16,
    patch_size=14,
    projection_dim=1024,
)


@pytest.mark.parametrize("base", list(_TRANSFORMERS))
def test_declared_sizes_are_what_diffusers_and_transformers_build_from_each_wan_config(base):
    family = _FAMILIES.get(base, wan.FAMILY)
    memory = family.memory_of(base)
    with torch.device("meta"):
        transformer = WanTransformer3DModel(**_TRANSFORMERS[base])
        built = {
            "transformer": transformer,
            "text_encoder": UMT5EncoderModel(_UMT5),
            "vae": AutoencoderKLWan(**(_VAE_22 if base == MODEL_ID_5B else {})),
        }
        if base == I2V_480P:
            built["image_encoder"] = CLIPVisionModelWithProjection(_CLIP)
        if base == I2V_A14B:
            built["transformer_2"] = WanTransformer3DModel(**_TRANSFORMERS[base])
    assert dict(memory.values) == {name: values(module) for name, module in built.items()}
    assert memory.largest_values == largest_values([transformer])
    # A quantized pool stores every stored component (both of an A14B's transformers): `linears` declares all.
    stored = [built[c] for c in family.stored]
    linears = [
        (n, m.out_features, m.in_features) for t in stored for n, m in t.named_modules() if isinstance(m, nn.Linear)
    ]
    assert memory.linears == linear_sizes(linears, None)
    assert memory.host_components == ("text_encoder",) and "text_encoder" not in family.components
    if base == I2V_A14B:
        # Both transformers quantized: no fused weight, so no swap scratch, is left on a quantized pool.
        assert memory.largest_encoder_values == 0


def test_a14b_holds_two_14b_transformers_and_the_720p_i2v_base_plans_its_larger_video():
    a14b = wan22.FAMILY.memory_of(A14B)
    assert a14b.values_of(("transformer_2",)) == a14b.values_of(("transformer",)) == wan_memory.MEMORY_14B.values[0][1]
    # A quantized A14B stores both transformers: no fused weight (no swap scratch) is left on it.
    assert a14b.largest_encoder_values == 0
    small, large = wan_i2v.FAMILY.memory_of(I2V_480P), wan_i2v.FAMILY.memory_of(I2V_720P)
    assert small.values == large.values and small.working_bytes < large.working_bytes


def test_video_tokens_follow_the_latent_shape_diffusers_makes():
    """(n - 1) / 4 + 1 latent frames of H/8 x W/8 in 2x2 patches: what WanTransformer3DModel embeds."""
    shape = wan_memory.SHAPE_1_3B
    frames, width, height = 9, 64, 48
    with torch.device("meta"):
        embed = WanTransformer3DModel(**_TRANSFORMERS[MODEL_ID]).patch_embedding
    latents = torch.empty(1, 16, (frames - 1) // 4 + 1, height // 8, width // 8, device="meta")
    assert embed(latents).flatten(2).shape[-1] == wan_memory.video_tokens(shape, frames, width, height)
    # Twice the frames' area twice the working memory (both grow with the tokens or pixels).
    one = wan_memory.step_bytes(shape, 81, 832, 480)
    assert wan_memory.step_bytes(shape, 81, 1664, 480) == 2 * one


def settings_for(*models: str, **changes: object) -> Settings:
    return Settings(dtype="auto", device="cpu", pools=tuple(PoolSetting(m, m) for m in models)).replace(
        **{"host_ram_bytes": HOST_RAM, **changes}
    )


def plan(settings: Settings, total: int):
    return plan_memory(needs_on_a_gpu(settings), total, PlanOptions.of(settings))


def test_the_small_wans_fit_24_gb_and_the_14b_needs_48_gb_in_fp8():
    assert plan(settings_for(MODEL_ID), A10G).resident
    (five,) = plan(settings_for(MODEL_ID_5B), A10G).placements
    assert five.host_components == ("text_encoder",)
    with pytest.raises(SettingsError, match=r"L40S \(48 GB\)"):
        plan(settings_for(MODEL_ID_14B, quantize="fp8"), A10G)
    (fp8,) = plan(settings_for(MODEL_ID_14B, quantize="fp8"), L40S).placements
    assert fp8.storage == "fp8"


def test_a14b_in_bf16_keeps_both_transformers_resident_on_80_gb():
    (placement,) = plan(settings_for(A14B), A100).placements
    assert placement.storage == "native" and placement.host_components == ("text_encoder",)
    assert placement.weights >= 2 * 2 * wan_memory.MEMORY_14B.values[0][1]
    with pytest.raises(SettingsError, match=r"A100 or H100 \(80 GB\)") as refused:
        plan(settings_for(A14B, quantize="off"), L40S)
    # The refusal names the storage that would fit there.
    assert "QUANTIZE=auto" in str(refused.value) or "QUANTIZE=fp8" in str(refused.value)


def test_a14b_in_fp8_with_branches_fits_an_l40s_with_both_transformers_stored_and_resident():
    settings = settings_for(A14B, quantize="fp8")
    (native,) = needs_on_a_gpu(settings)
    need = native.fp8
    assert need is not None
    memory = wan22.FAMILY.memory_of(A14B)
    both = memory.values_of(("transformer", "transformer_2"))
    assert memory.linears is not None and wan_memory.MEMORY_14B.linears is not None
    assert memory.linears.values == 2 * wan_memory.MEMORY_14B.linears.values
    # Both transformers in fp8 (a byte a value and their branches), nothing of them left touchable or in bf16.
    assert need.storage == "fp8" and need.touchable == 0
    assert both < need.weights - memory.values_of(("text_encoder", "vae")) * 2 < both * 1.2
    (placement,) = plan(settings, L40S).placements
    assert placement.storage == "fp8" and plan(settings, L40S).resident
    with pytest.raises(SettingsError, match=r"L40S \(48 GB\)"):
        plan(settings, A10G)


def test_i2v_a14b_plans_as_t2v_a14b_both_transformers_resident():
    (placement,) = plan(settings_for(I2V_A14B), A100).placements
    assert placement.storage == "native" and placement.host_components == ("text_encoder",)
    assert placement.weights >= 2 * 2 * wan_memory.MEMORY_I2V_A14B.values[0][1]
    with pytest.raises(SettingsError, match=r"A100 or H100 \(80 GB\)"):
        plan(settings_for(I2V_A14B, quantize="off"), L40S)
    # Both its transformers stored in fp8 too: an L40S holds it.
    assert plan(settings_for(I2V_A14B, quantize="fp8"), L40S).placements[0].storage == "fp8"
    (fp8,) = plan(settings_for(I2V_A14B, quantize="fp8"), A100).placements
    assert fp8.storage == "fp8"


# Each base's videos as its declaration plans them (`wan_memory.VideoPlan`): its transformer's and VAE's shapes.
_PLANS = {
    MODEL_ID: wan_memory.PLAN_1_3B,
    MODEL_ID_14B: wan_memory.PLAN_14B_720P,
    MODEL_ID_5B: wan_memory.PLAN_5B,
    I2V_480P: wan_memory.PLAN_14B_480P,
    I2V_720P: wan_memory.PLAN_14B_720P,
    A14B: wan_memory.PLAN_14B_720P,
    I2V_A14B: wan_memory.PLAN_14B_720P,
}
_LIMITS = Limits(max_loras=1, max_steps=50, max_prompt_chars=100, max_video_frames=1001)


def _most_frames(defaults: ModelDefaults, width: int, height: int) -> int | None:
    """The most frames the one gate (`normalise_request`) takes at this size, searched (None: none)."""
    low, high = 0, (defaults.max_frames - 1) // 4
    while low < high:
        middle = (low + high + 1) // 2
        try:
            normalise_request(
                GenerateRequest("a fox", width=width, height=height, num_frames=4 * middle + 1), defaults, _LIMITS
            )
            low = middle
        except LimitExceededError:
            high = middle - 1
    try:
        return normalise_request(
            GenerateRequest("a fox", width=width, height=height, num_frames=4 * low + 1), defaults, _LIMITS
        ).num_frames
    except LimitExceededError:
        return None


@pytest.mark.parametrize("base", list(_PLANS))
def test_every_video_the_gate_takes_fits_the_working_memory_the_plan_keeps(base):
    """The plan keeps a base's `working_bytes` free; the gate takes a video of at most its card size's tokens, at
    sides up to its largest: the most frames it takes at each size on a grid need no more working memory."""
    family = {I2V_720P: wan_i2v.FAMILY, A14B: wan22.FAMILY, **_FAMILIES}.get(base, wan.FAMILY)
    memory, plan = family.memory_of(base), _PLANS[base]
    cell = 2 * plan.shape.vae_scale
    defaults = ModelDefaults(
        steps=4, guidance=5.0, side=480, max_side=memory.largest_side, side_multiple=cell, video=True,
        num_frames=81, fps=16, max_frames=121, video_plan=memory.video_size,
    )  # fmt: skip
    # Its card's size is taken: 720P on the 720P bases (their largest side is 1280, not twice 480).
    frames, width, height = memory.video_size
    assert _most_frames(defaults, width, height) >= frames
    assert (height == 720) == (base in (MODEL_ID_14B, I2V_720P, A14B, I2V_A14B))
    for width in range(MIN_SIDE, memory.largest_side + 1, 2 * cell):
        for height in range(MIN_SIDE, width + 1, 2 * cell):
            most = _most_frames(defaults, width, height)
            if most is not None:
                assert wan_memory.working_bytes(plan.shape, most, width, height) <= memory.working_bytes, (
                    width,
                    height,
                )


def test_a_run_paused_between_two_blocks_keeps_what_the_plan_counts_for_it():
    # What diffusers' WanTransformer3DModel hands its second block (the hidden states, the rotary embeddings' cosines
    # and sines), in bf16 as served: the state a run paused between two blocks keeps (step sharing's pieces).
    torch.manual_seed(0)
    width, heads, frames, side = 64, 2, 9, 32
    model = WanTransformer3DModel(
        num_attention_heads=heads,
        attention_head_dim=width // heads,
        ffn_dim=96,
        num_layers=2,
        text_dim=32,
        freq_dim=32,
        rope_max_seq_len=32,
    ).to(torch.bfloat16)
    # As from_pretrained(torch_dtype=bf16) loads it: diffusers' `_keep_in_fp32_modules` (its rope) in float32.
    for name, module in model.named_modules():
        if set(name.split(".")) & set(model._keep_in_fp32_modules or ()):
            module.float()
    kept: list[int] = []

    def before(module: nn.Module, args: tuple) -> None:
        hidden, _, _, (cos, sin) = args
        kept.append(hidden.nbytes + cos.nbytes + sin.nbytes)

    model.blocks[1].register_forward_pre_hook(before)
    latent = torch.randn(1, 16, (frames - 1) // 4 + 1, side // 8, side // 8, dtype=torch.bfloat16)
    with torch.inference_mode():
        model(latent, torch.tensor([500]), torch.randn(1, 8, 32, dtype=torch.bfloat16))
    shape = wan_memory.VideoShape(width, 96, head=width // heads)
    assert kept == [wan_memory.midpass_bytes(shape, frames, side, side)]


def test_a_wan_pool_s_paused_state_counts_a_run_paused_mid_forward():
    # The 1.3B's plan at its card's size: 21 latent frames of 30 × 52 patches, 1536 wide in bf16, heads of 128.
    assert wan.FAMILY.memory.midpass_bytes == 21 * 30 * 52 * (2 * 1536 + 2 * 4 * 128)
    assert paused_bytes(wan.FAMILY.memory) - paused_bytes(replace(wan.FAMILY.memory, midpass_bytes=0)) == (
        wan.FAMILY.memory.midpass_bytes
    )
