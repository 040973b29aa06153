"""Finite factors whose fused weights overflow are refused, and the swap rolled back (issue 20, lower severity).

Before the fix a LoRA whose factors are finite but whose product overflows the weight's dtype (float16 on a GPU;
float32 here, with larger factors) was fused into infinities and gave a black image with a 200. The check reads a
fused weight back only where the bounds from preparation say it could overflow (issue 29): never for an ordinary
LoRA in bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from engine.errors import LimitExceededError
from engine.families.sdxl import build_tiny_pipeline
from engine.formats.targets import TargetTable
from engine.requests import GenerateRequest, LoraSpec
from engine.weights import swap
from engine.weights.swap import ActiveAdapter, WeightPatcher
from serving.demo.synthetic import find_targets, make_lora, peft_metadata, save_lora
from tests.support.checks import generate, unchanged
from tests.support.formats import load


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


# -- the weight patcher alone: float16 pools, where overflow is realistic, and the check's cost ----------------


def patcher_and_adapter(tmp_path, dtype: torch.dtype, factor: float):
    """A tiny UNet in `dtype` and a PEFT LoRA on its self-attention whose factors are multiplied by `factor`."""
    unet = build_tiny_pipeline().unet.to(dtype)
    table = TargetTable({"unet": unet})
    targets = find_targets({"unet": unet}, {"unet": (r"attn1\.to_q$",)})
    tensors = {name: t * factor for name, t in make_lora(targets, rank=4, seed=5, dtype=torch.float32).items()}
    path = save_lora(tmp_path / "lora.safetensors", tensors, peft_metadata(targets, rank=4, alpha=4))
    return WeightPatcher(table.params, torch.device("cpu")), table, load(path, table)


def test_ordinary_factors_that_overflow_float16_are_refused_with_the_base_exact(tmp_path):
    # Factors in the thousands, each one float16 holds: a ΔW that bfloat16 or float32 holds, float16 (largest 65504)
    # does not.
    patcher, table, adapter = patcher_and_adapter(tmp_path, torch.float16, 3000.0)
    assert all(t.abs().max() < 2**14 for layer in adapter.layers for t in layer.tensors)
    before = [p.detach().clone() for p in table.params]
    with pytest.raises(LimitExceededError, match=r"not finite in float16") as refused:
        patcher.apply([ActiveAdapter(adapter, 1.0)])
    assert 400 <= refused.value.status < 500
    assert not patcher.dirty
    assert all(torch.equal(p, b) for p, b in zip(table.params, before, strict=True))


def test_the_overflow_check_reads_nothing_back_for_an_ordinary_lora_in_bfloat16(tmp_path, monkeypatch):
    patcher, _, adapter = patcher_and_adapter(tmp_path, torch.bfloat16, 1.0)
    checked = []
    monkeypatch.setattr(swap, "_finite", lambda weight: checked.append(weight) or torch.tensor(True))
    for scale in (1.0, -2.0, 0.5):
        patcher.apply([ActiveAdapter(adapter, scale)])
    assert checked == []
    patcher.restore_all()
    # The same bounds do send a float16 pool's overflowing LoRA to the check.
    patcher, _, adapter = patcher_and_adapter(tmp_path, torch.float16, 3000.0)
    patcher.apply([ActiveAdapter(adapter, 1.0)])
    assert len(checked) == len(adapter.layers)
