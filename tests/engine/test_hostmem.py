"""Host RAM: what pinning takes (torch's own options, counted by the budgets), and what the machine allows."""

from __future__ import annotations

import pytest
import torch

from engine.caches.store import ByteLRU
from engine.errors import LimitExceededError
from engine.formats.adapters import AdapterKey, PreparedAdapter
from engine.formats.layers import LayerFactors
from engine.hostmem import PINNED_EXACT_ABOVE, cgroup_limit, configure_pinned, default_host_budget, pinned_nbytes
from engine.pools.hostplan import pristine_budget
from engine.settings import Settings
from engine.weights.swap import ActiveAdapter, WeightPatcher

GIB = 2**30


def test_pinned_buffers_above_the_threshold_are_pinned_at_their_size_and_smaller_ones_at_a_power_of_two():
    # Issue 29, 4.4: the SDXL flat buffer (6.46 GiB) pinned 8 GiB under torch's default rounding.
    sdxl = int(6.46 * GIB)
    assert pinned_nbytes(sdxl) == sdxl
    assert pinned_nbytes(PINNED_EXACT_ABOVE + 1) == PINNED_EXACT_ABOVE + 1
    assert pinned_nbytes(3000) == 4096 and pinned_nbytes(PINNED_EXACT_ABOVE) == PINNED_EXACT_ABOVE
    assert pinned_nbytes(0) == 0


def test_configure_pinned_sets_torch_s_own_options_and_keeps_what_was_set_before():
    before = torch._C._accelerator_getAllocatorSettings()
    try:
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
        configure_pinned()
        settings = torch._C._accelerator_getAllocatorSettings()
        assert settings.startswith("expandable_segments:False,")
        # Equal thresholds: no block pinned at its own size is ever cached and handed to a larger request.
        mib = PINNED_EXACT_ABOVE // 2**20
        assert f"pinned_max_round_threshold_mb:{mib}" in settings and f"pinned_max_cached_size_mb:{mib}" in settings
        configure_pinned()
        assert torch._C._accelerator_getAllocatorSettings() == settings
    finally:
        torch._C._accelerator_setAllocatorSettings(before or "expandable_segments:False")


def test_the_cgroup_limit_is_read_where_one_is_set(tmp_path):
    assert cgroup_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_limit(tmp_path) is None
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limit(tmp_path) is None
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{16 * GIB}\n")
    assert cgroup_limit(tmp_path) == 16 * GIB
    (tmp_path / "memory.max").write_text(f"{15 * GIB}\n")
    assert cgroup_limit(tmp_path) == 15 * GIB


def test_host_ram_bytes_is_auto_or_a_byte_size():
    assert Settings.from_env({}).host_ram_bytes is None
    assert Settings.from_env({"HOST_RAM_BYTES": "auto"}).host_ram_bytes is None
    assert Settings.from_env({"HOST_RAM_BYTES": "40GiB"}).host_ram_bytes == 40 * GIB
    # auto: the machine's RAM less the process's own margin (at least 3 GiB, an eighth of a large machine).
    assert default_host_budget(15 * 10**9) == 15 * 10**9 - 3 * GIB
    assert default_host_budget(128 * GIB) == 112 * GIB


def test_pinned_pristine_copies_count_their_pinned_size_against_the_budget():
    """Issue 29, 4.4: the budget counted nbytes; three 3000-byte weights pin 4096 bytes each."""
    weights = [torch.zeros(750) for _ in range(3)]
    patcher = WeightPatcher(weights, torch.device("cpu"), budget=3 * 3000, pin=True)
    layers = tuple(LayerFactors(i, torch.ones(1, 750), torch.ones(750, 1), 1.0) for i in range(3))
    adapter = PreparedAdapter(AdapterKey("hub", "a/b", "0" * 40, "w.safetensors"), layers, 1, 1, ("unet",))
    with pytest.raises(LimitExceededError, match=r"changes 0\.0 MiB .*PRISTINE_BYTES"):
        patcher.apply([ActiveAdapter(adapter, 1.0)])
    assert all(w.eq(0).all() for w in weights) and patcher.pristine_bytes == 0


def test_the_host_adapter_cache_counts_pinned_bytes_where_it_pins():
    layers = (LayerFactors(0, torch.ones(3, 250), torch.ones(250, 3), 1.0),)  # two 3000-byte factors
    adapter = PreparedAdapter(AdapterKey("hub", "a/b", "0" * 40, "w.safetensors"), layers, 1, 3, ("unet",))
    pinned, plain = ByteLRU("host", GIB, pinned=True), ByteLRU("host", GIB)
    for cache in (pinned, plain):
        cache.put(adapter.key, adapter, set())
    assert (pinned.nbytes, plain.nbytes) == (2 * 4096, 2 * 3000)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_large_odd_sized_pinned_buffer_pins_its_size_not_a_power_of_two():
    configure_pinned()
    size = 37 * 2**20 + 4321  # odd, as a 6.46 GiB flat buffer is: a power of two would be 64 MiB
    stat = "allocated_bytes.all.current"
    before = torch.cuda.host_memory_stats().get(stat, 0)
    buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    assert buffer.is_pinned()
    assert torch.cuda.host_memory_stats()[stat] - before == size
    del buffer


def test_under_pristine_bytes_auto_a_pinned_pool_s_budget_holds_every_weight_s_pinned_copy():
    """Counted as pinned, a LoRA touching every weight must still fit `auto` (no LoRA refused for its coverage)."""
    sizes = [3000, 5 * 2**20, 700]
    assert pristine_budget(sizes, pinned=True, pristine_bytes=None, host_pristine=None) == (
        4096 + 5 * 2**20 + 1024,
        "PRISTINE_BYTES",
    )
    # The plan's host share binds only where it left less than the touchable weights.
    assert pristine_budget(sizes, pinned=True, pristine_bytes=None, host_pristine=sum(sizes))[1] == "PRISTINE_BYTES"
    assert pristine_budget(sizes, pinned=True, pristine_bytes=None, host_pristine=2**20) == (2**20, "HOST_RAM_BYTES")
    assert pristine_budget(sizes, pinned=False, pristine_bytes=4000, host_pristine=4000) == (4000, "PRISTINE_BYTES")
