"""Each layer's bound from preparation is never below the exact max|ΔW| of random factors, ΔW as LyCORIS computes it.

ΔW comes from the LyCORIS 4.1.3 modules' own `get_diff_weight` / `get_merged_weight` holding the file's tensors
(kohya naming, as LyCORIS writes it), never from our formulas; the bounds are `engine.formats.bounds`'s, read
from the adapter `prepare` made.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from engine.families.sdxl import build_tiny_pipeline
from engine.formats.adapters import PreparedAdapter
from engine.formats.bounds import fused_bound
from engine.formats.targets import TargetTable
from serving.demo.synthetic import LoraTarget, find_targets, kohya_key, kohya_metadata, make_lora, save_lora
from serving.demo.synthetic_lycoris import lycoris_metadata, make_dora, make_loha, make_lokr
from tests.support.formats import components, load

lycoris_modules = pytest.importorskip("lycoris.modules")

# Linear and 3x3 convolution layers of the UNet: LoRA on a convolution is LoCon.
PATTERNS = {"unet": (r"attn1\.to_q$", r"attn2\.to_out\.0$", r"ff\.net\.2$", r"resnets\.\d+\.conv1$")}
# Both sides are rounded to float32 (ours and LyCORIS's products): a bound may meet ΔW within that.
ROUNDING = 1 + 1e-6
MakeModule = Callable[[str, nn.Module, dict[str, torch.Tensor]], nn.Module]


@pytest.fixture(scope="module")
def pipe():
    return build_tiny_pipeline()


@pytest.fixture(scope="module")
def table(pipe) -> TargetTable:
    return TargetTable(components(pipe))


@pytest.fixture(scope="module")
def targets(pipe) -> list[LoraTarget]:
    found = find_targets({"unet": pipe.unet}, PATTERNS)
    assert any(t.is_conv for t in found) and any(not t.is_conv for t in found)
    return found


def lycoris_module(
    make: MakeModule, tensors: dict[str, torch.Tensor], target: LoraTarget, pipe, scale: float
) -> nn.Module:
    org = pipe.unet.get_submodule(target.module)
    stem = kohya_key(target)
    module = make(stem, org, tensors)
    module.multiplier = scale
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name.startswith(f"{stem}.") and not name.endswith(".alpha"):
                module.get_parameter(name.removeprefix(f"{stem}.")).copy_(tensor)
    return module


def check_bounds(
    adapter: PreparedAdapter,
    table: TargetTable,
    targets: list[LoraTarget],
    pipe,
    make: MakeModule,
    tensors: dict[str, torch.Tensor],
    scale: float,
) -> None:
    """Per layer: |scale|·bound ≥ max|ΔW| (LyCORIS's), and the whole fuse's bound ≥ max|fused weight|."""
    by_name = {f"unet.{t.module}": t for t in targets}
    assert len(adapter.layers) == len(targets) == len(adapter.reach)
    for layer, reach in zip(adapter.layers, adapter.reach, strict=True):
        target = by_name[table.names[layer.target]]
        module = lycoris_module(make, tensors, target, pipe, scale)
        base = pipe.unet.get_submodule(target.module).weight.detach()
        with torch.no_grad():
            delta = module.get_diff_weight(multiplier=scale)[0].view(base.shape)
        exact = float(delta.abs().max())
        assert exact > 1e-4, f"{target.module}: the adapter must change the weight"
        # A bound can be tight (a LoKr half of rank 1 is an outer product): equal up to float32 rounding.
        assert abs(scale) * reach.delta * ROUNDING >= exact, target.module
        assert fused_bound(float(base.abs().max()), [(reach, scale)]) * ROUNDING >= float((base + delta).abs().max())


def lora_module(dim: int, alpha: float, tucker: bool = False) -> MakeModule:
    def make(stem: str, org: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
        return lycoris_modules.LoConModule(stem, org, 1.0, lora_dim=dim, alpha=alpha, use_tucker=tucker)

    return make


@pytest.mark.parametrize("scale", [1.0, -0.7])
def test_lora_and_locon_bounds_hold(pipe, table, targets, tmp_path, scale):
    tensors = make_lora(targets, rank=4, seed=51, fmt="kohya", alpha=3.0, strength=0.5, dtype=torch.float32)
    path = save_lora(tmp_path / "lora.safetensors", tensors, kohya_metadata(dim=4, alpha=3.0))
    adapter = load(path, table)
    assert adapter.kinds == ("LayerFactors",)
    check_bounds(adapter, table, targets, pipe, lora_module(4, 3.0), tensors, scale)


def test_tucker_locon_bounds_hold(pipe, table, targets, tmp_path):
    convs = [t for t in targets if t.is_conv and t.weight_shape[2:] == (3, 3)]
    generator = torch.Generator().manual_seed(52)
    tensors = {}
    for target in convs:
        stem, (out_ch, in_ch) = kohya_key(target), target.weight_shape[:2]
        tensors[f"{stem}.lora_down.weight"] = torch.randn((4, in_ch, 1, 1), generator=generator)
        tensors[f"{stem}.lora_mid.weight"] = torch.randn((4, 4, 3, 3), generator=generator)
        tensors[f"{stem}.lora_up.weight"] = torch.randn((out_ch, 4, 1, 1), generator=generator)
        tensors[f"{stem}.alpha"] = torch.tensor(2.0)
    adapter = load(save_lora(tmp_path / "locon.safetensors", tensors), table)
    assert adapter.kinds == ("TuckerFactors",)
    check_bounds(adapter, table, convs, pipe, lora_module(4, 2.0, tucker=True), tensors, 0.75)


@pytest.mark.parametrize(("rank", "tucker"), [(4, False), (16, False), (4, True)])
def test_loha_bounds_hold(pipe, table, targets, tmp_path, rank, tucker):
    tensors = make_loha(targets, rank=rank, seed=53, fmt="kohya", alpha=2.5, tucker=tucker, strength=1.0)
    metadata = lycoris_metadata("loha", targets, fmt="kohya", rank=rank, alpha=2.5)
    adapter = load(save_lora(tmp_path / "loha.safetensors", tensors, metadata), table)

    def make(stem: str, org: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
        alpha = float(tensors[f"{stem}.alpha"])
        return lycoris_modules.LohaModule(stem, org, 1.0, lora_dim=rank, alpha=alpha, use_tucker=tucker)

    check_bounds(adapter, table, targets, pipe, make, tensors, -1.3)


@pytest.mark.parametrize(("whole", "tucker", "alpha"), [(False, False, 1.0), (False, True, 0.0), (True, False, 3.0)])
def test_lokr_bounds_hold(pipe, table, targets, tmp_path, whole, tucker, alpha):
    tensors = make_lokr(targets, rank=2, seed=54, fmt="kohya", alpha=alpha, whole=whole, tucker=tucker, strength=1.0)
    metadata = lycoris_metadata("lokr", targets, fmt="kohya", rank=2, alpha=alpha)
    adapter = load(save_lora(tmp_path / "lokr.safetensors", tensors, metadata), table)

    def make(stem: str, org: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
        alpha = float(tensors[f"{stem}.alpha"])
        return lycoris_modules.LokrModule(stem, org, 1.0, lora_dim=2, alpha=alpha, use_tucker=tucker, full_matrix=whole)

    check_bounds(adapter, table, targets, pipe, make, tensors, 0.9)


@pytest.mark.parametrize("on_output", [True, False])
@pytest.mark.parametrize("kept", [False, True], ids=["recomputed", "kept-delta"])
def test_dora_bounds_hold(pipe, table, targets, tmp_path, on_output, kept):
    tensors = make_dora(targets, components(pipe), rank=4, seed=55, fmt="kohya", alpha=3.0, on_output=on_output)
    adapter = load(save_lora(tmp_path / "dora.safetensors", tensors), table, delta_budget=2**30 if kept else 0)
    assert adapter.kinds == ("DoraUpdate",)
    by_name = {f"unet.{t.module}": t for t in targets}
    for layer, reach in zip(adapter.layers, adapter.reach, strict=True):
        target = by_name[table.names[layer.target]]

        def make(stem: str, org: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
            return lycoris_modules.LoConModule(
                stem, org, 1.0, lora_dim=4, alpha=3.0, weight_decompose=True, wd_on_out=on_output
            )

        module = lycoris_module(make, tensors, target, pipe, 1.0)
        base = pipe.unet.get_submodule(target.module).weight.detach()
        with torch.no_grad():
            merged = module.get_merged_weight(multiplier=1.0)[0].view(base.shape)
            inner = module.get_diff_weight(multiplier=1.0)[0].view(base.shape)
        assert (merged - base).abs().max() > 1e-4
        # The LoRA part's bound, and the rescaled result's: rows (or columns) rescaled to the magnitude.
        assert reach.delta * ROUNDING >= float(inner.abs().max())
        assert reach.magnitude is not None and reach.magnitude * ROUNDING >= float(merged.abs().max())
        assert fused_bound(float(base.abs().max()), [(reach, 1.0)]) >= float(merged.abs().max())
