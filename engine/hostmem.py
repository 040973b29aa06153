"""Host RAM: what the machine (or its cgroup) allows, and what pinning a buffer really takes.

torch's CachingHostAllocator rounds every pinned allocation up to a power of two by default (a 6.46 GiB flat
buffer would pin 8 GiB, FLUX's 22.6 GiB 32 GiB). `configure_pinned` sets torch's own options so that allocations
above `PINNED_EXACT_ABOVE` are pinned at their size and given back when freed (`pinned_max_round_threshold_mb`
and `pinned_max_cached_size_mb`, equal so no unrounded block is ever cached and reused for a larger request);
smaller ones keep torch's rounding and caching. `pinned_nbytes` is what an allocation then pins, and the budgets
count that. `host_ram` is the machine's RAM or its cgroup's limit, whichever is smaller.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psutil
import torch

__all__ = ["PINNED_EXACT_ABOVE", "configure_pinned", "default_host_budget", "host_ram", "pinned_nbytes"]

logger = logging.getLogger(__name__)

# Pinned allocations above this are pinned at their size, uncached: the flat buffers, pristine copies of all but
# the smallest weights. Below it torch rounds up to a power of two (at most 1 MiB each) and caches freed blocks,
# which keeps the many small adapter factors from paying a cudaHostAlloc and a cudaFreeHost (a device sync) each.
PINNED_EXACT_ABOVE = 2**20
_PINNED_OPTIONS = {
    "pinned_max_round_threshold_mb": PINNED_EXACT_ABOVE // 2**20,
    "pinned_max_cached_size_mb": PINNED_EXACT_ABOVE // 2**20,
}
# What the process itself takes besides what the plan places (Python, torch, diffusers and Gradio, loading's
# transient copies): at least 3 GiB, or an eighth of the machine's RAM when that is more.
_MARGIN_MIN = 3 * 2**30
_MARGIN_SHARE = 8
# cgroup v2's and v1's memory limits; v1 reports "no limit" as a number near 2**63.
_CGROUP_FILES = ("memory.max", "memory/memory.limit_in_bytes")
_NO_LIMIT = 2**62


def configure_pinned() -> None:
    """Set torch's pinned-memory options (kept with whatever PYTORCH_ALLOC_CONF set), before anything is pinned."""
    current = torch._C._accelerator_getAllocatorSettings()
    ours = ",".join(f"{key}:{value}" for key, value in _PINNED_OPTIONS.items())
    if ours in current:
        return
    torch._C._accelerator_setAllocatorSettings(f"{current},{ours}" if current else ours)
    logger.info("pinned host memory: allocations above %d bytes pinned at their size (%s)", PINNED_EXACT_ABOVE, ours)


def pinned_nbytes(nbytes: int) -> int:
    """The host bytes pinning `nbytes` takes once `configure_pinned` ran: a power of two up to
    `PINNED_EXACT_ABOVE`, the size itself above it (cudaHostAlloc's page rounding aside, under 4 KiB)."""
    if nbytes <= 0:
        return 0
    if nbytes <= PINNED_EXACT_ABOVE:
        return 1 << (nbytes - 1).bit_length()
    return nbytes


def cgroup_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), None where none is set."""
    for name in _CGROUP_FILES:
        try:
            text = (root / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
    return None


def host_ram(root: Path = Path("/sys/fs/cgroup")) -> int:
    """The RAM this process may use: the machine's, or its cgroup's limit when that is smaller."""
    total = int(psutil.virtual_memory().total)
    limit = cgroup_limit(root)
    return total if limit is None else min(total, limit)


def default_host_budget(ram: int) -> int:
    """`HOST_RAM_BYTES=auto`: `ram` less the process's own margin."""
    return max(0, ram - max(_MARGIN_MIN, ram // _MARGIN_SHARE))
