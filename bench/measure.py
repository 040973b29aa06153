"""Timing that waits for the device, the rows of the results table, and the process's memory."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import torch

__all__ = ["FUSE_FLAGS", "Clock", "Row", "cpu_description", "format_table", "rss_bytes"]

# CPU flags that decide how fast a fuse runs: vector width, FMA, half-precision conversion, bf16/fp16 matrix units.
FUSE_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
    "asimd",
    "sve",
    "bf16",
)


class Clock:
    """`perf_counter` that first waits for queued GPU work, so a reading covers what was launched before it."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass(frozen=True)
class Row:
    """One measured method at one rank and file format; times in milliseconds."""

    rank: int
    fmt: str
    method: str
    samples_ms: tuple[float, ...]
    note: str = ""

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "n": self.n, "median_ms": self.median_ms, "min_ms": self.min_ms}


def cpu_description() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and its flags (Linux /proc/cpuinfo; elsewhere the platform's processor string, no flags)."""
    fields: dict[str, str] = {}
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name") or fields.get("cpu model") or platform.processor() or platform.machine()
    return name, tuple((fields.get("flags") or fields.get("features") or "").split())


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def format_table(
    rows: Sequence[Row], floor_ms: Mapping[tuple[int, str], float], reference_ms: Mapping[tuple[int, str], float]
) -> str:
    """One line per row, with its time over the floor and the reference cycle's time over it (same rank and format)."""
    header = f"{'rank':>4}  {'format':<6}  {'method':<34} {'n':>3}  {'median ms':>10}  {'min ms':>9}  "
    header += f"{'x floor':>8}  {'ref / this':>10}  note"
    lines = [header, "-" * len(header)]
    for row in rows:
        floor = floor_ms.get((row.rank, row.fmt))
        reference = reference_ms.get((row.rank, row.fmt))
        over_floor = f"{row.median_ms / floor:8.2f}" if floor else f"{'':8}"
        under_ref = f"{reference / row.median_ms:10.1f}" if reference and row.median_ms > 0 else f"{'':10}"
        lines.append(
            f"{row.rank:>4}  {row.fmt:<6}  {row.method:<34} {row.n:>3}  {row.median_ms:>10.1f}  {row.min_ms:>9.1f}  "
            f"{over_floor}  {under_ref}  {row.note}".rstrip()
        )
    return "\n".join(lines)
