"""Finite factors whose fused weights overflow are refused, and the swap rolled back (issue 20, lower severity).

Before the fix a LoRA whose factors are finite but whose product overflows the weight's dtype (float16 on a GPU;
float32 here, with larger factors) was fused into infinities and gave a black image with a 200.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from engine.errors import LimitExceededError
from engine.requests import GenerateRequest, LoraSpec
from serving.demo.synthetic import find_targets, make_lora
from tests.support.checks import generate, unchanged


def request(*loras: LoraSpec) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=1, seed=11, loras=loras)


@pytest.fixture
def huge(loaded, tmp_path):
    """A local LoRA on the UNet's self-attention whose factors are finite but whose ΔW overflows float32."""
    targets = find_targets({"unet": loaded.pipe.unet}, {"unet": (r"attn1\.to_q$",)})
    tensors = make_lora(targets, rank=2, seed=5, fmt="peft", dtype=torch.float32)
    scaled = {name: t * 1e21 for name, t in tensors.items()}
    assert all(torch.isfinite(t).all() for t in scaled.values())
    (tmp_path / "huge.safetensors").write_bytes(save(scaled))
    return tmp_path


def test_a_lora_whose_fused_weights_overflow_is_refused_and_rolled_back(make_engine, loaded, pristine, huge):
    engine = make_engine(local_lora_dir=huge)
    with unchanged(engine, loaded, pristine), pytest.raises(LimitExceededError, match=r"not finite in float32"):
        generate(engine, request(LoraSpec("local:huge.safetensors")))
    with pytest.raises(LimitExceededError) as refused:
        generate(engine, request(LoraSpec("local:huge.safetensors")))
    assert refused.value.status == 400
