"""The load `bench.serve` replays and what it measures: its options, each client's draws, the LoRAs' sizes, and
a mode's samples and summary. Shared by the entry point (bench/serve.py) and the run (bench/serve_run.py), so
neither imports the other."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MODES = ("fifo_inline", "affinity")
_MB = 10**6
_SDXL_MB = (20.0, 900.0)


@dataclass(frozen=True)
class Options:
    adapters: int
    clients: int
    requests: int
    warm: int
    zipf: float
    bandwidth_mb_s: float
    steps: int
    think_s: float
    max_skip: int
    workers: int
    seed: int
    json_path: Path | None
    plot_dir: Path | None = None


@dataclass(frozen=True)
class Sample:
    mode: str
    client: int
    transport: str
    adapter: int
    sent: float
    done: float
    ok: bool
    error: str

    @property
    def latency(self) -> float:
        return self.done - self.sent


@dataclass(frozen=True)
class ModeResult:
    mode: str
    samples: tuple[Sample, ...]
    runs: tuple[tuple[float, float, bool], ...]
    # From when each request could use the GPU (its adapters ready; in fifo_inline: queued) to its end.
    runnable: tuple[tuple[float, float], ...]
    max_overtakes: int
    wall_s: float

    @property
    def latencies(self) -> list[float]:
        return sorted(s.latency for s in self.samples if s.ok)

    def percentile(self, q: float) -> float:
        values = self.latencies
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    @property
    def gpu_busy(self) -> float:
        """Swap-and-inference time over the time work was queued for the GPU (a runnable request waiting or
        running). In fifo_inline a request holds the slot while it downloads, so all its time counts."""
        queued = _union(self.runnable)
        return _union([(start, end) for start, end, _ in self.runs]) / queued if queued else math.nan

    @property
    def gpu_busy_any(self) -> float:
        """Swap-and-inference time over the time at least one request was in the service at all."""
        present = _union([(s.sent, s.done) for s in self.samples])
        return _union([(start, end) for start, end, _ in self.runs]) / present if present else math.nan

    @property
    def swaps_per_request(self) -> float:
        return sum(1 for *_, swapped in self.runs if swapped) / max(1, len(self.runs))


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def draws(options: Options) -> list[list[tuple[int, float]]]:
    """Each client's sequence of (LoRA index, pause before it), the same for both modes; 0 = most popular."""
    weights = zipf_weights(options.adapters, options.zipf)
    out = []
    for client in range(options.clients):
        rng = random.Random(options.seed * 1000 + client)
        picks = rng.choices(range(options.adapters), weights=weights, k=options.requests)
        pauses = [rng.expovariate(1 / options.think_s) if options.think_s > 0 else 0.0 for _ in picks]
        out.append(list(zip(picks, pauses, strict=True)))
    return out


def sizes_mb(options: Options) -> list[float]:
    """SDXL LoRA sizes, log-uniform over 20–900 MB, independent of popularity."""
    rng = random.Random(options.seed + 7)
    low, high = map(math.log, _SDXL_MB)
    return [math.exp(rng.uniform(low, high)) for _ in range(options.adapters)]
