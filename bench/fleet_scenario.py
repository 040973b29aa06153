"""The fleet model's scenario: costs with their sources, the scenario's sizes, a request, and the adapter catalogue
(bench/fleet_model.py runs them)."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field

from bench.fleet_device import image_pieces
from bench.mixed import SDXL_A10G, WAN_A10G, WAN_STEP_PIECES
from engine.settings import Settings

__all__ = ["Catalogue", "Costs", "Request", "Scenario"]


@dataclass(frozen=True)
class Costs:
    """Seconds and bytes per step; every default has a stated source (docs/fleet.md)."""

    # The reference service's figure: one 1024x1024, 25-step SDXL image on an A10G.
    inference_s: float = 8.5
    # bench.swap, rank 32, bf16, 2-core CPU: (c) ours, cached adapter = 383 ms (README), times swap_scale.
    swap_cpu_s: float = 0.383
    # The swap is a memory-bound copy_ + addmm_ over ~1.9 GB of touched bf16 weights: an A10G moves
    # ~600 GB/s against the ~20 GB/s that 383 ms implies on the CPU (30x); 0.1 keeps a 3x margin for
    # the 1,120 kernel launches. Set 1.0 for a GPU figure measured by `bench.swap --device cuda`.
    swap_scale: float = 0.1
    # bench.swap (d) first-seen minus (c) cached, ranks 8/32/128 (23/93/372 MB files): 120/270/678 ms,
    # fitted as 83 ms + 1.6 ms per MB (read header, convert names, match factors, keep in the store).
    prepare_base_s: float = 0.083
    prepare_s_per_mb: float = 0.0016
    # Hub download on a cloud VM; a stated assumption (hf_transfer can do more, a busy Hub less).
    bandwidth_mb_s: float = 100.0
    # SDXL LoRA files span 20-900 MB (rank 4 to 128, with or without text encoders): log-uniform.
    size_min_mb: float = 20.0
    size_max_mb: float = 900.0
    # A video: Wan 2.1 1.3B 480p x 81 frames on an A10G, `bench.mixed`'s table (denoiser pieces: a step's two
    # guidance passes through 30 blocks each, a block a piece; s each; decode pieces, s each; pieces a step).
    image_steps: int = SDXL_A10G[0]
    video_pieces: int = WAN_A10G[0]
    video_piece_s: float = WAN_A10G[1]
    video_decode_pieces: int = WAN_A10G[2]
    video_decode_s: float = WAN_A10G[3]
    video_step_pieces: int = WAN_STEP_PIECES

    @property
    def swap_s(self) -> float:
        return self.swap_cpu_s * self.swap_scale

    def prepare_s(self, size_mb: float) -> float:
        return self.prepare_base_s + self.prepare_s_per_mb * size_mb

    def download_s(self, size_mb: float) -> float:
        return size_mb / self.bandwidth_mb_s

    def pieces(self, video: bool, split: bool) -> list[float]:
        """A run's pieces of device time (`split`: an image's steps one by one, else its inference as one)."""
        if video:
            return [self.video_piece_s] * self.video_pieces + [self.video_decode_s] * self.video_decode_pieces
        return image_pieces(self.image_steps, self.inference_s / self.image_steps) if split else [self.inference_s]

    def chunks(self, video: bool, split: bool) -> int:
        """A run's last `pieces` that are its VAE decode's, timed apart as the engine times them: a video's decode
        chunks; a split image's decode (`image_pieces`); none of an image as one piece."""
        return self.video_decode_pieces if video else int(split)


@dataclass(frozen=True)
class Scenario:
    adapters: int = 2500
    replicas: int = 5
    # Prepared adapters per replica: a little under the engine's 4 GiB host cache over the 231 MB mean file (~18).
    capacity: int = 16
    disk_gb: float = 100.0  # Hub cache per replica; 0 downloads every miss
    zipf: float = 1.1
    warmup: int = 12000  # requests run before measuring: the disks reach their steady state
    requests: int = 9000  # requests measured
    clients: int | None = None  # closed loop with this many clients instead of Poisson arrivals
    # Poisson arrivals after a warm-up sent by this many closed-loop clients (fast, as a real cluster can afford)
    warmup_clients: int | None = None
    costs: Costs = field(default_factory=Costs)
    video_share: float = 0.0  # the share of requests that are videos
    # How a replica's GPU is shared by its pools, and the starvation bound: the engine's own settings
    # (DEVICE_SHARING, STEP_SHARING_STARVE_STEPS), their defaults read from engine.settings, never restated.
    device_sharing: str = field(default_factory=lambda: Settings().device_sharing)
    starve_steps: float = field(default_factory=lambda: Settings().step_sharing_starve_steps)

    def __post_init__(self) -> None:
        for name in ("adapters", "replicas", "capacity", "requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is too small; accepted: 1 or more")
        if self.warmup < 0 or self.disk_gb < 0 or self.zipf < 0 or not 0 <= self.video_share <= 1:
            raise ValueError("warmup, disk_gb and zipf must not be negative, video_share must be within 0-1")
        if self.clients is not None and self.clients < 1:
            raise ValueError(f"clients={self.clients} is too small; accepted: 1 or more, or None for Poisson")
        if self.warmup_clients is not None and self.warmup_clients < 1:
            raise ValueError(f"warmup_clients={self.warmup_clients} is too small; accepted: 1 or more, or None")

    @property
    def saturation_rate(self) -> float:
        """Requests per second the replicas serve with every GPU busy on inference alone (images and videos in
        their shares)."""
        video_s = sum(self.costs.pieces(True, split=False))
        return self.replicas / ((1 - self.video_share) * self.costs.inference_s + self.video_share * video_s)


@dataclass(frozen=True)
class Request:
    index: int
    adapter: int
    arrival: float
    video: bool = False


class Catalogue:
    """Adapter popularity (Zipf over popularity rank = adapter id) and file sizes (log-uniform)."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        weights = [1.0 / (rank + 1) ** scenario.zipf for rank in range(scenario.adapters)]
        total = sum(weights)
        self.share = [w / total for w in weights]
        self._cumulative = list(itertools.accumulate(self.share))
        rng = random.Random(f"sizes-{seed}")
        low, high = math.log(scenario.costs.size_min_mb), math.log(scenario.costs.size_max_mb)
        self.size_mb = [math.exp(rng.uniform(low, high)) for _ in range(scenario.adapters)]

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self._cumulative, rng.random()), len(self.share) - 1)
