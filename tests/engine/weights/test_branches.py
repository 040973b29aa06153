"""`Branches` on a small denoiser of its own: what it cannot hold is refused before anything changes (a module
without a branch named, a set over the branch rank), what it holds is exactly the set's factors, packed, and a swap
failing half-way leaves nothing behind once cleared."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.errors import IncompatibleLoraError, LimitExceededError
from engine.formats.adapters import AdapterKey, PreparedAdapter
from engine.formats.layers import LayerFactors
from engine.formats.targets import TargetTable
from engine.weights.branches import Branches
from engine.weights.quantized import BranchedLinear, held_branches, quantize_denoiser
from engine.weights.swap import ActiveAdapter

pytest.importorskip("torchao")


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 24)
        self.conv = nn.Conv2d(4, 4, 3)
        self.out = nn.Linear(24, 16)


def adapter(name: str, table: TargetTable, rank: int, modules: tuple[str, ...], seed: int) -> PreparedAdapter:
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for module in modules:
        index = table.lookup("transformer", module)
        assert index is not None
        weight = table.params[index]
        down = torch.randn(rank, weight[0].numel() if weight.dim() > 2 else weight.shape[1], generator=generator)
        layers.append(LayerFactors(index, down, torch.randn(weight.shape[0], rank, generator=generator), 0.5))
    return PreparedAdapter(AdapterKey("test", name, "0" * 40, "x"), tuple(layers), 0, rank, ("transformer",))


@pytest.fixture
def parts():
    torch.manual_seed(0)
    model = Denoiser()
    quantize_denoiser(model, rank=6, dtype=torch.float32)
    table = TargetTable({"transformer": model}, denoiser="transformer")
    return model, table, Branches(table, model)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for m in model.modules() if isinstance(m, BranchedLinear) for b in m.buffers()]


def test_a_set_is_held_packed_along_the_rank_with_its_scales_and_the_rest_zero(parts):
    model, table, branches = parts
    first, second = adapter("a", table, 2, ("proj", "out"), 1), adapter("b", table, 3, ("proj",), 2)
    branches.apply(branches.plan([ActiveAdapter(first, 1.0), ActiveAdapter(second, -2.0)]))
    proj = model.proj
    assert isinstance(proj, BranchedLinear) and proj.branch_rank == 5
    assert torch.equal(proj.lora_down[:2], first.layers[0].down) and torch.equal(
        proj.lora_down[2:5], second.layers[0].down
    )
    assert proj.lora_scales.tolist() == [0.5, 0.5, -1.0, -1.0, -1.0, 0.0] and not proj.lora_up[:, 5:].any()
    x = torch.randn(3, 16)
    delta = x @ (0.5 * first.layers[0].up @ first.layers[0].down - 1.0 * second.layers[0].up @ second.layers[0].down).T
    base = nn.functional.linear(x, proj.dequantized(torch.float32), proj.bias)
    torch.testing.assert_close(proj(x) - base, delta, rtol=1e-4, atol=1e-5)
    branches.apply(branches.plan([ActiveAdapter(first, 1.0)]))
    assert proj.branch_rank == 2 and not proj.lora_down[2:].any() and not proj.lora_scales[2:].any()


def test_a_module_without_a_branch_is_refused_by_name_and_nothing_changes(parts):
    model, table, branches = parts
    branches.apply(branches.plan([ActiveAdapter(adapter("a", table, 2, ("proj",), 1), 1.0)]))
    before = snapshot(model)
    with pytest.raises(IncompatibleLoraError, match=r"adapts transformer\.conv, which have no low-rank branch"):
        branches.plan([ActiveAdapter(adapter("c", table, 2, ("proj", "conv"), 3), 1.0)])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(model), strict=True))


def test_a_set_whose_ranks_add_up_past_the_branch_is_refused_naming_both(parts):
    _, table, branches = parts
    first, second = adapter("a", table, 4, ("proj",), 1), adapter("b", table, 3, ("proj", "out"), 2)
    with pytest.raises(
        LimitExceededError, match=r"\['a' rank 4, 'b' rank 3\] needs rank 7 together at transformer\.proj"
    ):
        branches.plan([ActiveAdapter(first, 1.0), ActiveAdapter(second, 1.0)])


def padded(module: BranchedLinear, x: torch.Tensor) -> torch.Tensor:
    """The module's padded formula (a GPU's, or compiled): on the CPU, what an input that needs gradients runs."""
    with torch.enable_grad():
        return module(x.requires_grad_()).detach()


# The second set's copies: down and up of each part (proj's two, out's one); nothing to zero (it holds more).
COPIES = 2 * (2 + 1)


@pytest.mark.parametrize("failing", range(1, COPIES + 1))
def test_a_swap_failing_at_any_copy_leaves_every_branch_zero_once_cleared(parts, monkeypatch, failing):
    """A copy raising half-way through a swap (here the `failing`-th): after `clear` (the rollback), every branch
    buffer is zero and the padded formula gives the base output; branches written before the failure were missed."""
    import engine.weights.quantized as quantized

    model, table, branches = parts
    inputs = [torch.randn(3, 16), torch.randn(3, 24)]
    base = [padded(m, i) for m, i in zip((model.proj, model.out), inputs, strict=True)]
    branches.apply(branches.plan([ActiveAdapter(adapter("a", table, 1, ("proj",), 1), 1.0)]))
    second = [
        ActiveAdapter(adapter("b", table, 2, ("proj", "out"), 2), 1.0),
        ActiveAdapter(adapter("c", table, 3, ("proj",), 3), 1.0),
    ]
    copy, calls = quantized._copy, []

    def fails(target: torch.Tensor, source: torch.Tensor | float) -> None:
        calls.append(1)
        if len(calls) == failing:
            raise RuntimeError("injected copy failure")
        copy(target, source)

    monkeypatch.setattr(quantized, "_copy", fails)
    with pytest.raises(RuntimeError, match="injected"):
        branches.apply(branches.plan(second))
    monkeypatch.setattr(quantized, "_copy", copy)
    assert held_branches(model), "the failure left part of the set written"
    branches.clear()
    assert held_branches(model) == [] and branches.held == frozenset()
    for module, given, expected in zip((model.proj, model.out), inputs, base, strict=True):
        assert torch.equal(padded(module, given), expected)
