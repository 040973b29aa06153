"""Devices compare by what they name: `cuda` is `cuda:N` for the current N, and a pool already on the device is
never copied in again (issue 29 §4.1: `torch.device("cuda") == torch.device("cuda:0")` is False)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.devices import normal_device, same_device
from engine.pools import residency as residency_module
from engine.pools.flat import FlatWeights
from engine.pools.residency import Residency


@pytest.fixture
def current_cuda(monkeypatch):
    """A CPU-only torch made to answer that CUDA device 0 is the current one (nothing is allocated on it)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_cuda_without_an_index_is_the_current_cuda_device(current_cuda):
    assert torch.device("cuda") != torch.device("cuda", 0)  # torch's own `==`: why the helper exists
    assert same_device(torch.device("cuda"), torch.device("cuda", 0))
    assert same_device("cuda:0", "cuda")
    assert normal_device("cuda") == torch.device("cuda", 0)
    assert not same_device(torch.device("cuda"), torch.device("cuda", 1))
    assert not same_device(torch.device("cuda", 0), torch.device("cpu"))


def test_the_cpu_has_no_index_and_a_cpu_comparison_never_asks_cuda(monkeypatch):
    def refuse() -> int:
        raise AssertionError("CUDA asked for its current device while comparing with the CPU")

    monkeypatch.setattr(torch.cuda, "current_device", refuse)
    assert same_device(torch.device("cpu", 0), torch.device("cpu"))
    assert normal_device("cpu:0") == torch.device("cpu")
    assert not same_device("cpu", "cuda")


class _Tensor:
    """What `Residency.add` reads of a tensor on the GPU: its device, as CUDA tensors report it (with an index)."""

    device = torch.device("cuda", 0)


def test_a_pool_already_on_the_device_is_not_moved_in_again(current_cuda, monkeypatch):
    moves: list[torch.device] = []
    monkeypatch.setattr(residency_module, "module_tensors", lambda modules: iter([_Tensor(), _Tensor()]))
    monkeypatch.setattr(FlatWeights, "to_device", lambda self, device: moves.append(device) or 0)
    # The setting's device, as `resolve_device("cuda")` returns it: no index.
    residency = Residency(torch.device("cuda"), budget=None)
    assert residency.add("pool", [nn.Linear(2, 2)], before_leaving=lambda: None)
    assert moves == []
    assert residency.snapshot()[0].moves_in == 0
