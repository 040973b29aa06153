"""The small value types of requests and results that need nothing of them (re-exported by `engine.requests`,
where every caller reads them): what a LoRA suggests, what a run took, which adapters it used, its seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["MAX_SEED", "AdapterUse", "Soundtrack", "Suggested", "Timings", "seeds_of"]

MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class Suggested:
    """Defaults a request's LoRAs bring (a speed LoRA's sampler, steps and guidance; a card's recommendations):
    they take the place of the pool's where the client set nothing. `sources` says where each came from."""

    steps: int | None = None
    guidance: float | None = None
    scheduler: str | None = None
    clip_skip: int | None = None
    sources: tuple[tuple[str, str], ...] = ()
    # The low-noise stage's guidance on a two-stage pool (Wan 2.2 A14B): a speed LoRA's, which is no CFG on both.
    guidance_2: float | None = None


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of one request."""

    resolve: float = 0.0
    prepare: float = 0.0
    apply: float = 0.0
    inference: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class AdapterUse:
    """What one LoRA of a result was: where it came from and whether the cache had it."""

    ref: str
    revision: str
    weight_name: str
    scale: float
    cache: Literal["hit", "miss"]
    # The file's hash as A1111 writes it in `Lora hashes` (12 hex digits; Civitai's AutoV3).
    hash: str = ""
    # The fine-tune it was trained for when it ran on a pool of another base (a Civitai "Pony" LoRA on SDXL);
    # None when it ran on the base it declares.
    trained_for: str | None = None
    # Its scale on a two-stage pool's low-noise transformer (`LoraSpec.scale_2`); None: `scale` there too.
    scale_2: float | None = None
    # A pair's two files as the recipe names them ("high: a, low: b"); "" for one file. Kept apart from
    # `weight_name`, which stays the cache key's (a replica pins the adapter by it: `serving.cluster.replica`).
    files: str = ""


@dataclass(frozen=True, eq=False)
class Soundtrack:
    """A video's sound as its pipeline made it (LTX-2's vocoder): float samples in [-1, 1], one row a channel,
    at `rate` a second, starting with the first frame."""

    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return int(self.samples.shape[-1]) / self.rate


def seeds_of(seed: int, count: int) -> tuple[int, ...]:
    """`count` consecutive seeds from `seed`, wrapping within 0..MAX_SEED (each a valid request seed)."""
    return tuple((seed + i) % (MAX_SEED + 1) for i in range(count))
