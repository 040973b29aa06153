"""An ahead-of-time denoiser reads its module's tensors once, not per call (issue 29 §4.10: walking SDXL's UNet
for its 1,680 tensors on every denoising step), and is bound again when a move re-pointed them.

The package is a stand-in (compiling a real one is ZeroGPU's slow test, tests/reliability/test_zerogpu_aot.py):
what is checked here is the binding, which is this project's code."""

from __future__ import annotations

import torch
from torch import nn

from engine.pipeline import aot as aot_module
from engine.pipeline.aot import AotDenoiser, AotPackage
from engine.pipeline.compiled import shape_key
from engine.pools.flat import FlatWeights


class _Runner:
    """What `aoti_load_package` returns, as far as binding reads it: constant names, and the constants bound."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.bound: list[dict[str, int]] = []

    def get_constant_fqns(self) -> list[str]:
        return self.names

    def load_constants(self, constants: dict[str, torch.Tensor], **_: object) -> None:
        self.bound.append({name: t.data_ptr() for name, t in constants.items()})

    def __call__(self, *args: object) -> list[torch.Tensor]:
        return [torch.zeros(1)]


def test_calls_do_not_walk_the_module_and_a_move_binds_it_again(monkeypatch):
    module = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    names = [name for name, _ in module.named_parameters()]
    runner = _Runner(names)
    monkeypatch.setattr(aot_module.torch._inductor, "aoti_load_package", lambda archive: runner)
    x = torch.zeros(1, 4)
    aot = AotDenoiser.install(module, [AotPackage(shape_key((x,), {}), b"")], "default")
    walks: list[int] = []
    walk = module.named_parameters
    monkeypatch.setattr(module, "named_parameters", lambda *a, **k: walks.append(1) or walk(*a, **k))

    for _ in range(5):
        module(x)
    assert aot.compiled_calls == 5 and aot.binds == 1
    assert len(walks) <= 1

    # A move re-points the same Parameter objects to new memory: the runner is bound to the new addresses.
    weights = FlatWeights([module], pin=False)
    weights.to_host()
    walks.clear()  # the move itself walks the module, once
    module(x)
    module(x)
    assert aot.binds == 2
    assert runner.bound[-1] == {name: t.data_ptr() for name, t in walk()}
    assert walks == []
