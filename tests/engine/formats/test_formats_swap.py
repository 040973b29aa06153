"""Swapping LoHa, LoKr, DoRA and plain LoRA together: one rounding per weight, bit-exact restores, clear refusals.

References are PEFT's merges (in float64 for the rounding check) and PEFT's forward pass with several
adapters active; the engine-level tests use the stand-in Hub's LyCORIS/DoRA fixture repos.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from torch.utils._python_dispatch import TorchDispatchMode

from engine.errors import UnsupportedLoraVariantError
from engine.families.sdxl import build_tiny_pipeline
from engine.formats.adapters import PreparedAdapter
from engine.formats.layers import LayerFactors, Scratch, factors_in_float32
from engine.formats.targets import TargetTable
from engine.requests import GenerateRequest, LoraSpec
from engine.weights import swap
from engine.weights.swap import ActiveAdapter, WeightPatcher
from lora_catalog import scan_local_dirs
from lora_catalog.entries import LoraEntry
from serving.demo.synthetic import UNET_ATTENTION, find_targets, kohya_key, make_lora, peft_metadata, save_lora
from serving.demo.synthetic_lycoris import lycoris_metadata, make_dora, make_loha, make_lokr
from serving.ui.formatting import entry_card
from tests.support.checks import assert_pristine, generate
from tests.support.formats import COMPONENTS, PATTERNS, components, load

UNSUPPORTED = {
    "OFT": {"oft_blocks": (2, 8, 8)},
    "BOFT": {"boft_R": (2, 8, 8), "boft_s": (64, 1)},
    "IA3": {"weight": (64,), "on_input": ()},
    "full weight differences": {"diff": (64, 64), "diff_b": (64,), "diff_m": (64,)},
    "GLoRA": {"a1.weight": (4, 64), "a2.weight": (64, 4), "b1.weight": (4, 64), "b2.weight": (64, 4)},
    "LoRA bias terms": {"lora_down.weight": (4, 64), "lora_up.weight": (64, 4), "lora_up.bias": (64,)},
}


def every_format(pipe, table: TargetTable, folder: Path) -> list[PreparedAdapter]:
    """One adapter of each kind and naming, over attention, feed-forward, conv and text-encoder layers."""
    parts = components(pipe)
    targets = find_targets(parts, PATTERNS)
    made = {
        "lora-kohya": (make_lora(targets, rank=4, seed=1, fmt="kohya", alpha=2), {}),
        "lora-peft": (make_lora(targets, rank=8, seed=2), peft_metadata(targets, rank=8, alpha=4)),
        "loha-kohya-tucker": (make_loha(targets, rank=4, seed=3, alpha=2, tucker=True), {}),
        "loha-peft": (
            make_loha(targets, rank=4, seed=4, fmt="peft"),
            lycoris_metadata("loha", targets, fmt="peft", rank=4, alpha=2),
        ),
        "lokr-kohya-tucker": (make_lokr(targets, rank=2, seed=5, tucker=True), {}),
        "lokr-peft-whole": (make_lokr(targets, rank=2, seed=6, fmt="peft", whole=True), {}),
        "dora-kohya-in": (make_dora(targets, parts, rank=4, seed=7, fmt="kohya", on_output=False), {}),
        "dora-kohya-out": (make_dora(targets, parts, rank=4, seed=8, fmt="kohya"), {}),
        "dora-peft": (
            make_dora(targets, parts, rank=4, seed=9),
            lycoris_metadata("dora", targets, fmt="peft", rank=4, alpha=4),
        ),
    }
    return [load(save_lora(folder / f"{name}.safetensors", t, m), table) for name, (t, m) in made.items()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_mixed_run_leaves_every_weight_bit_exact(tmp_path, dtype):
    pipe = build_tiny_pipeline()
    for name in COMPONENTS:
        getattr(pipe, name).to(dtype)
    table = TargetTable(components(pipe))
    adapters = every_format(pipe, table, tmp_path)
    assert {kind for a in adapters for kind in a.kinds} == {"DoraUpdate", "LayerFactors", "LohaFactors", "LokrFactors"}
    before = {f"{c}.{k}": v.clone() for c in COMPONENTS for k, v in getattr(pipe, c).state_dict().items()}
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    rng = random.Random(0)
    changed = 0
    for _ in range(40):
        chosen = rng.sample(adapters, rng.randint(0, 3))
        patcher.apply([ActiveAdapter(a, rng.choice([1.0, 0.7, 0.0, -0.4])) for a in chosen])
        changed += sum(not torch.equal(table.params[i], before[table.names[i] + ".weight"]) for i in patcher.dirty)
    patcher.restore_all()
    assert changed > 500, "the run must actually change weights"
    for c in COMPONENTS:
        for key, value in getattr(pipe, c).state_dict().items():
            assert torch.equal(bits(value), bits(before[f"{c}.{key}"])), f"{c}.{key} drifted"


def bits(tensor: torch.Tensor) -> torch.Tensor:
    # compared as integers: bit-exact, -0.0 differs from 0.0
    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def test_bfloat16_weights_are_rounded_once_from_a_float64_merge(tmp_path):
    """Ours against PEFT's merge in float64, rounded to bfloat16: equal but for rare ties of float32 rounding."""
    pipe = build_tiny_pipeline()
    pipe.unet.to(torch.bfloat16)
    table = TargetTable({"unet": pipe.unet})
    targets = find_targets({"unet": pipe.unet}, {"unet": UNET_ATTENTION})
    tensors = make_lora(targets, rank=8, seed=51, alpha=4, strength=0.5)
    adapter = load(
        save_lora(tmp_path / "lora.safetensors", tensors, peft_metadata(targets, rank=8, alpha=4)),
        table,
    )
    base = {table.names[layer.target]: table.params[layer.target].detach().clone() for layer in adapter.layers}
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(adapter, 0.8)])
    ours = {table.names[layer.target]: table.params[layer.target].detach().clone() for layer in adapter.layers}
    # the kernel this replaces: factors cast to bfloat16, addmm_ in bfloat16 (rounds factors, product and sum)
    old = {}
    for layer in adapter.layers:
        weight = base[table.names[layer.target]].clone()
        up, down = layer.up.to(torch.bfloat16), layer.down.to(torch.bfloat16)
        old[table.names[layer.target]] = weight.view(weight.shape[0], -1).addmm_(up, down, alpha=0.8 * layer.scaling)
    patcher.restore_all()
    reference_unet = build_tiny_pipeline().unet.to(torch.bfloat16).double()
    peft_model = get_peft_model(
        reference_unet, LoraConfig(r=8, lora_alpha=4, target_modules=[t.module for t in targets])
    )
    state = {
        f"base_model.model.{t.module}.lora_{ab}.weight": tensors[f"unet.{t.module}.lora_{ab}.weight"].double()
        for t in targets
        for ab in "AB"
    }
    assert not set_peft_model_state_dict(peft_model, state).unexpected_keys
    for module in peft_model.modules():
        if isinstance(module, BaseTunerLayer):
            module.set_scale("default", 0.8)
    merged = peft_model.merge_and_unload()
    ours_wrong = old_wrong = total = 0
    for name, weight in ours.items():
        exact = merged.get_submodule(name.removeprefix("unet.")).weight.detach().to(torch.bfloat16)
        ours_wrong += int((weight != exact).sum())
        old_wrong += int((old[name] != exact).sum())
        total += weight.numel()
        # never more than one bfloat16 step from the correctly rounded weight, or float32's own error where
        # the base and ΔW nearly cancel
        step = torch.finfo(torch.bfloat16).eps * exact.float().abs() + 1e-6 * base[name].float().abs()
        assert bool(((weight.float() - exact.float()).abs() <= step).all()), name
    assert ours_wrong / total < 1e-3, (ours_wrong, total)
    assert old_wrong > 10 * max(ours_wrong, 1), (old_wrong, ours_wrong)


def test_dora_with_another_adapter_on_the_same_weights_matches_peft_forward(tmp_path):
    """Each DoRA adds (f - 1)·W0 + f·s·ΔW, as PEFT's forward pass computes with both adapters active."""
    pipe = build_tiny_pipeline()
    table = TargetTable({"unet": pipe.unet})
    targets = find_targets({"unet": pipe.unet}, {"unet": UNET_ATTENTION})[:6]
    dora = make_dora(targets, {"unet": pipe.unet}, rank=4, seed=61)
    plain = make_lora(targets, rank=4, seed=62)
    dora_adapter = load(
        save_lora(tmp_path / "dora.safetensors", dora, lycoris_metadata("dora", targets, fmt="peft", rank=4, alpha=4)),
        table,
    )
    plain_adapter = load(
        save_lora(tmp_path / "plain.safetensors", plain, peft_metadata(targets, rank=4, alpha=2)),
        table,
    )
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(plain_adapter, 0.9), ActiveAdapter(dora_adapter, 0.6)])
    ours = {table.names[i]: table.params[i].detach().clone() for i in patcher.dirty}
    patcher.restore_all()

    reference = build_tiny_pipeline().unet
    modules = [t.module for t in targets]
    model = get_peft_model(reference, LoraConfig(r=4, lora_alpha=4, use_dora=True, target_modules=modules), "dora")
    model.add_adapter("plain", LoraConfig(r=4, lora_alpha=2, target_modules=modules))
    for name, tensors in (("dora", dora), ("plain", plain)):
        state = {f"base_model.model.{k.removeprefix('unet.')}": v.float() for k, v in tensors.items()}
        assert not set_peft_model_state_dict(model, state, adapter_name=name).unexpected_keys
    model.base_model.set_adapter(["dora", "plain"])
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.set_scale("dora", 0.6)
            module.set_scale("plain", 0.9)
    generator = torch.Generator().manual_seed(0)
    for target in targets:
        layer = model.base_model.model.get_submodule(target.module)
        x = torch.randn((5, target.weight_shape[1]), generator=generator)
        with torch.no_grad():
            expected = layer(x)
            mine = torch.nn.functional.linear(x, ours[f"unet.{target.module}"], layer.get_base_layer().bias)
        torch.testing.assert_close(mine, expected, rtol=1e-5, atol=2e-6, msg=target.module)


@pytest.mark.parametrize("variant", sorted(UNSUPPORTED))
def test_unsupported_variants_are_refused_by_name_and_marked_in_the_catalogue(tmp_path, variant):
    pipe = build_tiny_pipeline()
    table = TargetTable(components(pipe))
    target = find_targets({"unet": pipe.unet}, {"unet": UNET_ATTENTION})[0]
    stem = kohya_key(target)
    tensors = {f"{stem}.{name}": torch.ones(shape) for name, shape in UNSUPPORTED[variant].items()}
    path = save_lora(tmp_path / "variant.safetensors", tensors)
    before = [p.detach().clone() for p in table.params]
    with pytest.raises(UnsupportedLoraVariantError, match=rf"uses {variant}, which the fused swap cannot apply"):
        load(path, table)
    assert all(torch.equal(p, b) for p, b in zip(table.params, before, strict=True))
    (entry,) = scan_local_dirs([tmp_path]).entries
    assert entry.unsupported == variant
    assert LoraEntry.from_json(entry.to_json()).unsupported == variant
    assert f"not supported: {variant}" in entry_card(entry, "https://huggingface.co")


def test_supported_formats_are_not_marked_in_the_catalogue(tmp_path):
    pipe = build_tiny_pipeline()
    table = TargetTable(components(pipe))
    every_format(pipe, table, tmp_path)
    entries = scan_local_dirs([tmp_path]).entries
    assert len(entries) == 9
    assert [e.ref for e in entries if e.unsupported] == []


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


def test_the_engine_serves_lycoris_and_dora_repos_and_restores_the_base(engine, fixtures, loaded, pristine):
    def request(*loras: LoraSpec) -> GenerateRequest:
        return GenerateRequest(prompt="a fox", loras=loras, steps=2, width=64, height=64, seed=3)

    base = generate(engine, request())
    images = {}
    for role in ("loha", "lokr", "dora"):
        check = engine.check_lora(LoraSpec(fixtures[role]))
        assert check.layers > 0 and set(check.components) == {"unet", "text_encoder", "text_encoder_2"}
        images[role] = generate(engine, request(LoraSpec(fixtures[role], scale=0.8)))
        assert np.abs(pixels(images[role].image) - pixels(base.image)).mean() > 1, role
    together = generate(engine, request(*(LoraSpec(fixtures[r], scale=0.5) for r in ("loha", "lokr", "dora", "kohya"))))
    assert together.image.tobytes() not in {i.image.tobytes() for i in images.values()}
    again = generate(engine, request())
    assert again.image.tobytes() == base.image.tobytes()
    assert_pristine(loaded, pristine)


class _Ops(TorchDispatchMode):
    """Counts the aten ops run under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_a_swap_casts_all_its_float16_factors_in_one_op(tmp_path, monkeypatch):
    """Per-factor casts were two small parallel regions per layer, which a loaded CPU made cost ours 1.2-1.5x
    the floor on FLUX (`bench.swap --family flux`); counted, not timed: one `cat`, no per-factor `_to_copy`."""
    pipe = build_tiny_pipeline()
    pipe.unet.to(torch.bfloat16)
    table = TargetTable({"unet": pipe.unet})
    targets = find_targets({"unet": pipe.unet}, {"unet": UNET_ATTENTION})
    paths = [
        save_lora(
            tmp_path / f"{seed}.safetensors",
            {k: v.half() for k, v in make_lora(targets, rank=4, seed=seed, fmt="kohya", alpha=2).items()},
            {},
        )
        for seed in (61, 62)
    ]
    adapters = [load(path, table) for path in paths]
    assert {t.dtype for a in adapters for layer in a.layers for t in layer.tensors} == {torch.float16}
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(adapters[0], 1.0)])  # the first touch copies and reads each weight once
    with _Ops() as ops:
        patcher.apply([ActiveAdapter(adapters[1], 0.7)])
    one_chunk = [table.params[layer.target].clone() for layer in adapters[1].layers]
    layers = len(adapters[1].layers)
    assert ops.counts["cat"] == 1, ops.counts
    assert ops.counts["_to_copy"] == 0, ops.counts
    assert ops.counts["addmm_"] == layers, ops.counts
    # A set too large for one cast is cast in chunks (the scratch stays bounded), to the same weights.
    monkeypatch.setattr(
        swap, "_CHUNK_VALUES", 2 * max(layer.up.numel() + layer.down.numel() for layer in adapters[1].layers)
    )
    patcher.apply([ActiveAdapter(adapters[0], 1.0)])
    with _Ops() as ops:
        patcher.apply([ActiveAdapter(adapters[1], 0.7)])
    assert 1 < ops.counts["cat"] <= layers, ops.counts
    fused = [table.params[layer.target] for layer in adapters[1].layers]
    assert all(torch.equal(a, b) for a, b in zip(fused, one_chunk, strict=True))
    patcher.restore_all()


def test_a_factor_shared_by_several_layers_is_cast_once():
    """kohya's fused qkv gives q, k and v one down factor: it is cast once, and each layer reads that cast."""
    down, ups = torch.randn(4, 16).half(), [torch.randn(8, 4).half() for _ in range(3)]
    layers = [LayerFactors(i, down, up, 0.5) for i, up in enumerate(ups)]
    ready = factors_in_float32(layers, torch.device("cpu"), Scratch())
    cast = [ready[id(layer)] for layer in layers]
    assert len({layer.down.data_ptr() for layer in cast}) == 1
    assert len({layer.up.data_ptr() for layer in cast}) == 3
    for layer, made in zip(layers, cast, strict=True):
        assert made.down.dtype == made.up.dtype == torch.float32
        assert torch.equal(made.down, layer.down.float()) and torch.equal(made.up, layer.up.float())
