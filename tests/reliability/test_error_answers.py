"""Every error is an answer of the tree (issue 20, defect 7): JSON with a fitting status on `POST /`, counted.

Before the fix an error outside the tree (ZeroGPU's refusals: `test_zerogpu.py`; a library's exception) came back
from `POST /` as the server's plain-text 500, and running out of memory while a pool was moved onto the device
escaped as torch's own error with the pool half moved.
"""

from __future__ import annotations

import re

import httpx
import pytest
import torch
from torch import nn

from engine.errors import GpuUnavailableError
from engine.pools.flat import FlatWeights
from engine.pools.residency import Residency, module_bytes
from serving.backends.local import LocalBackend
from tests.support.app_server import serve_routes

BODY = {"inputs": "a fox", "parameters": {"num_inference_steps": 1, "seed": 2}}


class Counting:
    """An observer of how requests ended (what `serving.http.metrics` subscribes)."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int]] = []

    def request_done(self, transport: str, status: int) -> None:
        self.done.append((transport, status))

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def test_an_error_outside_the_tree_is_a_json_500_and_counted(make_engine):
    class Broken(LocalBackend):
        async def generate(self, request, **kwargs):
            raise KeyError("a library's own error")

    backend = Broken.of(make_engine())
    counted = Counting()
    backend.subscribe(counted)
    with serve_routes(backend) as url:
        answer = httpx.post(url, json=BODY, timeout=60)
    assert answer.status_code == 500
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["error_type"] == "GenerationError"
    assert re.fullmatch(r"the request failed \(request id [0-9a-f]{12}\)", answer.json()["error"])
    assert counted.done == [("http", 500)]


def test_out_of_memory_moving_a_pool_in_is_a_503_and_leaves_it_where_it_was(monkeypatch):
    first, second = nn.Linear(64, 64), nn.Linear(64, 64)
    before = {k: v.clone() for k, v in second.state_dict().items()}
    residency = Residency(torch.device("cpu"), module_bytes([first]))
    residency.add("first", [first], before_leaving=lambda: None)
    residency.add("second", [second], before_leaving=lambda: None)  # does not fit beside the first: in host RAM

    def out_of_memory(self, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 KiB")

    monkeypatch.setattr(FlatWeights, "to_device", out_of_memory)
    refusal = pytest.raises(GpuUnavailableError, match=r"pool second could not be moved onto cpu")
    with refusal as refused, residency.use("second"):
        pass
    assert refused.value.status == 503
    assert {m.name: m.resident for m in residency.snapshot()}["second"] is False
    assert all(torch.equal(v, before[k]) for k, v in second.state_dict().items())
    monkeypatch.undo()
    with residency.use("second"):
        assert all(torch.equal(v, before[k]) for k, v in second.state_dict().items())
