"""LoHa, LoKr, Tucker LoCon and DoRA fused by the engine against the libraries' own merges and forward passes.

References: PEFT's `LoHaModel`/`LoKrModel`/`LoraModel(use_dora=True)` `merge_and_unload` on fresh tiny
pipeline modules loaded with the same file's tensors (PEFT naming), and the LyCORIS 4.1.3 modules'
forward pass on the same inputs (kohya naming) — never our own formulas.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from peft import LoHaConfig, LoKrConfig, LoraConfig, set_peft_model_state_dict
from peft.tuners.loha import LoHaModel
from peft.tuners.lokr import LoKrModel
from peft.tuners.lora import LoraModel
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from engine.families.sdxl import build_tiny_pipeline
from engine.formats.adapters import PreparedAdapter
from engine.formats.layers import LayerDelta
from engine.formats.targets import TargetTable
from serving.demo.synthetic import (
    LoraTarget,
    find_targets,
    kohya_key,
    save_lora,
)
from serving.demo.synthetic_lycoris import lycoris_metadata, make_dora, make_loha, make_lokr
from tests.support.formats import COMPONENTS, PATTERNS, components
from tests.support.formats import load as load_file

lycoris_modules = pytest.importorskip("lycoris.modules")


@pytest.fixture(scope="module")
def pipe():
    return build_tiny_pipeline()


@pytest.fixture(scope="module")
def table(pipe) -> TargetTable:
    return TargetTable(components(pipe))


@pytest.fixture(scope="module")
def targets(pipe) -> list[LoraTarget]:
    return find_targets(components(pipe), PATTERNS)


def load(path: Path, table: TargetTable, pipe, *, delta_budget: int = 0) -> PreparedAdapter:
    return load_file(path, table, delta_budget=delta_budget)


def fused(adapter: PreparedAdapter, table: TargetTable, scale: float) -> dict[str, torch.Tensor]:
    """The weights the engine's swap makes for `adapter` at `scale`, by table name; the table is restored after."""
    from engine.weights.swap import ActiveAdapter, WeightPatcher

    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(adapter, scale)])
    out = {table.names[layer.target]: table.params[layer.target].detach().clone() for layer in adapter.layers}
    patcher.restore_all()
    return out


def peft_merged(
    make_model: Callable[[str], nn.Module],
    tuner: type,
    config_for: Callable[[list[str]], object],
    tensors: dict[str, torch.Tensor],
    targets: Sequence[LoraTarget],
    scale: float,
) -> dict[str, torch.Tensor]:
    """PEFT's merge_and_unload of the file's tensors on fresh modules, per component, by `component.module`."""
    merged = {}
    for component in COMPONENTS:
        modules = [t.module for t in targets if t.component == component]
        if not modules:
            continue
        model = make_model(component)
        wrapper = tuner(model, config_for(modules), "default")
        prefix = f"{component}."
        state = {}
        for name, tensor in tensors.items():
            if name.startswith(prefix):
                key = name.removeprefix(prefix)
                # Files name CLIP modules under `text_model.`, which recent transformers flattened in CLIPTextModel.
                state[key if hasattr(model, "text_model") else key.removeprefix("text_model.")] = tensor.float()
        loaded = set_peft_model_state_dict(wrapper.model, state)
        assert not loaded.unexpected_keys, loaded.unexpected_keys[:5]
        for layer in wrapper.model.modules():
            if isinstance(layer, BaseTunerLayer):
                layer.set_scale("default", scale)
        plain = wrapper.merge_and_unload()
        for module in modules:
            merged[f"{component}.{module}"] = plain.get_submodule(module).weight.detach().clone()
    return merged


def fresh(component: str) -> nn.Module:
    return getattr(build_tiny_pipeline(), component)


def assert_weights_match(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], base) -> None:
    assert ours.keys() == reference.keys()
    for name, weight in ours.items():
        torch.testing.assert_close(weight, reference[name], rtol=1e-5, atol=1e-6, msg=name)
        # the adapter changed every weight it names, by far more than the tolerance
        assert (reference[name] - base[name]).abs().max() > 1e-4, name


@pytest.fixture(scope="module")
def base_weights(table) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in zip(table.names, table.params, strict=True)}


# -- PEFT naming, against PEFT's merge ------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.6])
@pytest.mark.parametrize("tucker", [False, True])
@pytest.mark.parametrize("kept", [False, True], ids=["recomputed", "kept-delta"])
def test_peft_loha_matches_peft_merge(pipe, table, targets, base_weights, tmp_path, scale, tucker, kept):
    tensors = make_loha(targets, rank=4, seed=31, fmt="peft", tucker=tucker)
    path = save_lora(
        tmp_path / "loha.safetensors", tensors, lycoris_metadata("loha", targets, fmt="peft", rank=4, alpha=3)
    )
    # kept: the ΔW computed once at preparation (what the engine does on the CPU within its budget)
    adapter = load(path, table, pipe, delta_budget=2**30 if kept else 0)
    assert all(isinstance(layer, LayerDelta) == kept for layer in adapter.layers)
    reference = peft_merged(
        fresh,
        LoHaModel,
        lambda modules: LoHaConfig(r=4, alpha=3, target_modules=modules, use_effective_conv2d=tucker),
        tensors,
        targets,
        scale,
    )
    assert_weights_match(fused(adapter, table, scale), reference, base_weights)


@pytest.mark.parametrize(("rank", "r", "alpha", "whole"), [(2, 2, 3.0, False), (2, 64, 48.0, True)])
def test_peft_lokr_matches_peft_merge(pipe, table, targets, base_weights, tmp_path, rank, r, alpha, whole):
    # With r = 64 PEFT keeps both Kronecker halves whole (r >= half a factor) and still scales by alpha / r.
    tensors = make_lokr(targets, rank=rank, seed=32, fmt="peft", whole=whole)
    metadata = lycoris_metadata("lokr", targets, fmt="peft", rank=r, alpha=alpha)
    adapter = load(save_lora(tmp_path / "lokr.safetensors", tensors, metadata), table, pipe)
    reference = peft_merged(
        fresh, LoKrModel, lambda modules: LoKrConfig(r=r, alpha=alpha, target_modules=modules), tensors, targets, 0.8
    )
    assert_weights_match(fused(adapter, table, 0.8), reference, base_weights)


@pytest.mark.parametrize("scale", [1.0, 0.5])
@pytest.mark.parametrize("kept", [False, True], ids=["recomputed", "kept-delta"])
def test_peft_dora_matches_peft_merge(pipe, table, targets, base_weights, tmp_path, scale, kept):
    tensors = make_dora(targets, components(pipe), rank=4, seed=33, fmt="peft")
    metadata = lycoris_metadata("dora", targets, fmt="peft", rank=4, alpha=2)
    path = save_lora(tmp_path / "dora.safetensors", tensors, metadata)
    adapter = load(path, table, pipe, delta_budget=2**30 if kept else 0)
    assert adapter.kinds == ("DoraUpdate",)
    # kept: the LoRA part's ΔW computed at preparation; the rescale stays per swap
    assert all(isinstance(layer.inner, LayerDelta) == kept for layer in adapter.layers)
    reference = peft_merged(
        fresh,
        LoraModel,
        lambda modules: LoraConfig(r=4, lora_alpha=2, use_dora=True, target_modules=modules),
        tensors,
        targets,
        scale,
    )
    assert_weights_match(fused(adapter, table, scale), reference, base_weights)


# -- kohya naming (as LyCORIS writes it), against the LyCORIS modules' forward pass ----------------


def lycoris_outputs(
    make_module: Callable[[str, nn.Module], nn.Module],
    tensors: dict[str, torch.Tensor],
    targets: Sequence[LoraTarget],
    pipe,
    ours: dict[str, torch.Tensor],
    scale: float,
) -> None:
    """Each target's output through a LyCORIS module holding the file's tensors equals ours through the fused weight.

    Both run in float64 (on a copy of the layer, the file's and our fused float32 values widened exactly): in float32
    the order of a 3x3 conv's sums (our one fused weight, LyCORIS's chain of convs) moved one output of 8192 by
    2.6e-6 on an AMD EPYC, past the tolerance, which is then left to what our fused float32 weight rounds."""
    generator = torch.Generator().manual_seed(0)
    for target in targets:
        org = copy.deepcopy(components(pipe)[target.component].get_submodule(target.module)).double()
        stem = kohya_key(target)
        module = make_module(stem, org).double()
        module.multiplier = scale
        with torch.no_grad():
            for name, tensor in tensors.items():
                if name.startswith(f"{stem}.") and not name.endswith(".alpha"):
                    module.get_parameter(name.removeprefix(f"{stem}.")).copy_(tensor)
            weight = ours[f"{target.component}.{target.module}"].double()
            if isinstance(org, nn.Conv2d):
                x = torch.randn((2, org.in_channels, 8, 8), generator=generator, dtype=torch.float64)
                mine = F.conv2d(x, weight, org.bias, org.stride, org.padding, org.dilation, org.groups)
            else:
                x = torch.randn((3, org.in_features), generator=generator, dtype=torch.float64)
                mine = F.linear(x, weight, org.bias)
            reference = module(x)
            changed = (reference - org(x)).abs().max()
        assert changed > 1e-3, f"{stem}: the adapter must change the output"
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=2e-6, msg=lambda m, stem=stem: f"{stem}: {m}")


def alpha_of(tensors: dict[str, torch.Tensor], stem: str) -> float:
    return float(tensors[f"{stem}.alpha"])


@pytest.mark.parametrize("scale", [1.0, -0.7])
@pytest.mark.parametrize(("rank", "tucker"), [(4, False), (16, False), (4, True)])
@pytest.mark.parametrize("kept", [False, True], ids=["recomputed", "kept-delta"])
def test_kohya_loha_matches_lycoris_forward(pipe, table, targets, tmp_path, scale, rank, tucker, kept):
    # rank 4 takes the one-product path (r² <= 64), rank 16 two products and a Hadamard product
    tensors = make_loha(targets, rank=rank, seed=41, fmt="kohya", alpha=2.5, tucker=tucker)
    metadata = lycoris_metadata("loha", targets, fmt="kohya", rank=rank, alpha=2.5)
    path = save_lora(tmp_path / "loha.safetensors", tensors, metadata)
    adapter = load(path, table, pipe, delta_budget=2**30 if kept else 0)
    assert all(isinstance(layer, LayerDelta) == kept for layer in adapter.layers)

    def module(stem: str, org: nn.Module) -> nn.Module:
        alpha = alpha_of(tensors, stem)
        return lycoris_modules.LohaModule(stem, org, 1.0, lora_dim=rank, alpha=alpha, use_tucker=tucker)

    lycoris_outputs(module, tensors, targets, pipe, fused(adapter, table, scale), scale)


@pytest.mark.parametrize(("whole", "tucker", "alpha"), [(False, False, 1.0), (False, True, 0.0), (True, False, 3.0)])
def test_kohya_lokr_matches_lycoris_forward(pipe, table, targets, tmp_path, whole, tucker, alpha):
    # alpha 0 means alpha = dim; whole halves mean scale 1 whatever the alpha (LyCORIS lokr.py 207-212).
    tensors = make_lokr(targets, rank=2, seed=42, fmt="kohya", alpha=alpha, whole=whole, tucker=tucker)
    metadata = lycoris_metadata("lokr", targets, fmt="kohya", rank=2, alpha=alpha)
    adapter = load(save_lora(tmp_path / "lokr.safetensors", tensors, metadata), table, pipe)

    def module(stem: str, org: nn.Module) -> nn.Module:
        return lycoris_modules.LokrModule(
            stem, org, 1.0, lora_dim=2, alpha=alpha_of(tensors, stem), use_tucker=tucker, full_matrix=whole
        )

    lycoris_outputs(module, tensors, targets, pipe, fused(adapter, table, 0.9), 0.9)


@pytest.mark.parametrize("on_output", [True, False])
@pytest.mark.parametrize("kept", [False, True], ids=["recomputed", "kept-delta"])
def test_kohya_dora_matches_lycoris_forward(pipe, table, targets, tmp_path, on_output, kept):
    # LyCORIS scales DoRA by interpolating its rescale factor, PEFT by scaling ΔW: they agree at scale 1.
    tensors = make_dora(targets, components(pipe), rank=4, seed=43, fmt="kohya", alpha=3.0, on_output=on_output)
    adapter = load(save_lora(tmp_path / "dora.safetensors", tensors), table, pipe, delta_budget=2**30 if kept else 0)
    assert adapter.kinds == ("DoraUpdate",)
    assert all(isinstance(layer.inner, LayerDelta) == kept for layer in adapter.layers)

    def module(stem: str, org: nn.Module) -> nn.Module:
        return lycoris_modules.LoConModule(
            stem, org, 1.0, lora_dim=4, alpha=3.0, weight_decompose=True, wd_on_out=on_output
        )

    lycoris_outputs(module, tensors, targets, pipe, fused(adapter, table, 1.0), 1.0)


def test_kohya_tucker_locon_matches_lycoris_forward(pipe, table, targets, tmp_path):
    convs = [t for t in targets if t.is_conv and t.weight_shape[2:] == (3, 3)]
    generator = torch.Generator().manual_seed(44)
    tensors = {}
    for target in convs:
        stem, (out_ch, in_ch) = kohya_key(target), target.weight_shape[:2]
        tensors[f"{stem}.lora_down.weight"] = torch.randn((4, in_ch, 1, 1), generator=generator) / in_ch**0.5
        tensors[f"{stem}.lora_mid.weight"] = torch.randn((4, 4, 3, 3), generator=generator) / 6
        tensors[f"{stem}.lora_up.weight"] = torch.randn((out_ch, 4, 1, 1), generator=generator) * 0.1
        tensors[f"{stem}.alpha"] = torch.tensor(2.0)
    adapter = load(save_lora(tmp_path / "locon.safetensors", tensors), table, pipe)
    assert adapter.kinds == ("TuckerFactors",) and len(adapter.layers) == len(convs)

    def module(stem: str, org: nn.Module) -> nn.Module:
        return lycoris_modules.LoConModule(stem, org, 1.0, lora_dim=4, alpha=2.0, use_tucker=True)

    lycoris_outputs(module, tensors, convs, pipe, fused(adapter, table, 0.75), 0.75)
