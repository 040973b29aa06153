"""Residency: flat moves keep every Parameter and byte, a pool that fits nothing is refused when added (a lone
pool is never evicted), and pristine copies on the device count against its room."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.errors import SettingsError
from engine.pools.flat import FlatWeights, module_bytes, module_tensors
from engine.pools.residency import Residency

CPU = torch.device("cpu")


class Block(nn.Module):
    """Weights of several dtypes, a tied weight, an integer and a boolean buffer, as real pipelines have."""

    def __init__(self, seed: int, width: int = 24) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(50, width).to(torch.bfloat16)
        self.proj = nn.Linear(width, 50, bias=True).to(torch.bfloat16)
        self.proj.weight = self.embed.weight  # tied, as CLIP's and T5's embeddings may be
        self.norm = nn.LayerNorm(width)  # float32 beside bfloat16
        self.register_buffer("position_ids", torch.arange(77).unsqueeze(0))
        self.register_buffer("mask", torch.rand(3, 5) > 0.5)


def bits(module: nn.Module) -> dict[str, bytes]:
    """Every parameter and buffer as its raw bytes, with its dtype and shape."""
    return {
        name: (str(t.dtype), tuple(t.shape), t.detach().contiguous().view(torch.uint8).numpy().tobytes())
        for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers())
    }


def test_a_flat_move_keeps_every_parameter_object_and_byte_in_one_buffer():
    block = Block(0)
    before, params = bits(block), list(block.parameters())
    weights = FlatWeights([block], pin=False)
    assert weights.nbytes == module_bytes([block])
    for _ in range(2):
        assert weights.to_host() >= weights.nbytes
        assert weights.to_device(CPU) >= weights.nbytes
        assert bits(block) == before
        assert all(a is b for a, b in zip(params, block.parameters(), strict=True))
        assert block.proj.weight is block.embed.weight
        # One buffer: every tensor is a view of the same storage.
        assert len({t.untyped_storage().data_ptr() for t in module_tensors([block])}) == 1


def test_the_host_buffer_is_kept_and_a_move_out_is_one_copy_into_it():
    block = Block(1)
    weights = FlatWeights([block], pin=False)
    weights.to_host()
    host = weights.host_buffer
    weights.to_device(CPU)
    assert block.norm.weight.untyped_storage().data_ptr() != host.untyped_storage().data_ptr()
    weights.to_host()
    assert weights.host_buffer is host
    assert block.norm.weight.untyped_storage().data_ptr() == host.untyped_storage().data_ptr()


def test_a_tensor_replaced_between_moves_is_moved_with_its_own_values():
    block = Block(2)
    weights = FlatWeights([block], pin=False)
    weights.to_host()
    weights.to_device(CPU)
    # As the pivotal-token patcher does: a new Parameter, of another shape, in a module's place.
    block.embed.weight = nn.Parameter(torch.randn(53, 24, dtype=torch.bfloat16), requires_grad=False)
    expected = bits(block)
    weights.to_host()
    weights.to_device(CPU)
    assert bits(block) == expected
    assert len({t.untyped_storage().data_ptr() for t in module_tensors([block])}) == 1


def test_a_lone_pool_larger_than_the_room_is_refused_when_added_not_at_each_request():
    """Issue 20, defect 6: SDXL on a 12 GB card was moved out at start and every request failed with a 500."""
    block = Block(3)
    size = module_bytes([block])
    residency = Residency(CPU, size - 1)
    with pytest.raises(SettingsError, match=r"pool sdxl needs .* GiB on the device .* accepted: a pool that fits"):
        residency.add("sdxl", [block], before_leaving=lambda: None)
    assert residency.snapshot() == ()


def test_a_lone_pool_that_fits_is_never_moved_out():
    block = Block(4)
    size = module_bytes([block])
    left = []
    residency = Residency(CPU, size + 4096)
    assert residency.add("only", [block], before_leaving=lambda: left.append(1), pristine=4096)
    for _ in range(3):
        with residency.use("only") as moved_s:
            assert moved_s == 0.0
    (memory,) = residency.snapshot()
    assert memory.resident and memory.moves_in == 0 and not left


def test_pristine_copies_on_the_device_count_against_its_room():
    """Issue 20, defect 10a: two pools whose weights fit together, but not with their pristine copies."""
    a, b = Block(5), Block(6)
    size = module_bytes([a])
    expected = bits(a), bits(b)
    left: list[str] = []
    residency = Residency(CPU, 2 * size + size // 2)
    assert residency.add("a", [a], before_leaving=lambda: left.append("a"), pristine=size)
    assert not residency.add("b", [b], before_leaving=lambda: left.append("b"), pristine=size)
    with residency.use("b") as moved_s:
        assert moved_s > 0
        assert [m.resident for m in residency.snapshot()] == [False, True]
    with residency.use("a"):
        assert [m.resident for m in residency.snapshot()] == [True, False]
    assert left == ["b", "a", "b"]
    assert (bits(a), bits(b)) == expected
    assert [m.moves_in for m in residency.snapshot()] == [1, 1]


# -- on a GPU (never run where this was written: no GPU was lent) -------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_pool_moves_between_a_pinned_host_buffer_and_one_device_buffer():
    block = Block(7)
    before, params = bits(block), list(block.parameters())
    weights = FlatWeights([block], pin=True)
    weights.to_host()
    assert weights.host_buffer.is_pinned()
    cuda = torch.device("cuda")
    for _ in range(2):
        weights.to_device(cuda)
        assert all(t.device.type == "cuda" for t in module_tensors([block]))
        assert len({t.untyped_storage().data_ptr() for t in module_tensors([block])}) == 1
        weights.to_host()
        assert bits(block) == before
        assert all(a is b for a, b in zip(params, block.parameters(), strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_engine_on_a_gpu_reports_what_its_pristine_copies_may_take_there(base_settings):
    from engine.pipeline.loading import load_pipeline
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver

    settings = base_settings.replace(device="cuda", dtype="float16")
    loaded = load_pipeline(settings)
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    touchable = module_bytes(getattr(loaded.pipe, c) for c in loaded.components)
    on_device = Engine(loaded, settings, resolver)
    assert 0 < on_device.pristine_device_bytes <= touchable
    on_host = Engine(loaded, settings.replace(pristine_store="cpu"), resolver)
    assert on_host.pristine_device_bytes == 0
    small = Engine(loaded, settings.replace(pristine_bytes=1024), resolver)
    assert small.pristine_device_bytes == 1024
    for engine in (on_device, on_host, small):
        engine.close()
