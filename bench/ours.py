"""Our swap as the engine runs it, the floor any exact fused swap must pay, and the LoRA files both use.

The floor is the fastest way this machine finds to reach the weights the engine makes (ΔW in float32,
rounded once into the weight), not the engine's own code path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.caches.store import AdapterStore
from engine.families.registry import spec_for
from engine.formats.adapters import AdapterKey, LayerFactors, PreparedAdapter, prepare
from engine.formats.targets import TargetTable
from engine.weights.swap import ActiveAdapter, WeightPatcher
from lora_catalog.entries import Family
from lora_catalog.sft_header import read_header
from serving.demo.synthetic import LoraTarget, kohya_metadata, make_lora, peft_metadata, save_lora

from .measure import Clock

__all__ = ["FORMATS", "Floor", "LoraPair", "Ours", "round_robin", "write_pair"]

FORMATS = ("peft", "kohya")
_REVISION = "0" * 40


@dataclass(frozen=True)
class LoraPair:
    """Two different adapters of the same rank and format: a swap goes from one to the other."""

    rank: int
    fmt: str
    paths: tuple[Path, Path]

    @property
    def file_size(self) -> int:
        return self.paths[0].stat().st_size


def write_pair(folder: Path, targets: Sequence[LoraTarget], *, rank: int, fmt: str, prefix: str = "") -> LoraPair:
    """Two LoRA files for `targets` in `fmt` ("peft" or "kohya"), with the metadata their trainers write."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: {', '.join(FORMATS)}")
    metadata = peft_metadata(targets, rank=rank, alpha=rank) if fmt == "peft" else kohya_metadata(dim=rank, alpha=rank)
    paths = tuple(
        save_lora(
            folder / f"{prefix}r{rank}-{fmt}-{name}.safetensors",
            make_lora(targets, rank=rank, seed=seed, fmt=fmt),
            metadata,
        )
        for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2))
    )
    return LoraPair(rank, fmt, paths)


def round_robin(clock: Clock, swaps: Mapping[str, Callable[[int], object]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds of each method's `swap(1)` … `swap(repeats)`, taking turns, after an untimed `swap(0)` each.

    Taking turns spreads any load from other processes over all methods alike, so their ratios hold
    on a busy machine. Every method must touch the same weights and restore them all before fusing.
    """
    for swap in swaps.values():
        swap(0)
    samples: dict[str, list[float]] = {name: [] for name in swaps}
    for index in range(1, repeats + 1):
        for name, swap in swaps.items():
            started = clock()
            swap(index)
            samples[name].append((clock() - started) * 1000)
    return samples


class Ours:
    """The engine's swap path for one denoiser (an SDXL UNet, a FLUX transformer): target table with its family's
    converter, pristine-restoring patcher and adapter store."""

    def __init__(
        self,
        unet: nn.Module,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_rank: int,
        cache_bytes: int,
        family: Family = Family.SDXL,
        more: Mapping[str, nn.Module] | None = None,
    ) -> None:
        spec = spec_for(family)
        self.unet = unet
        # `more`: a two-stage family's second transformer (Wan 2.2 A14B's `transformer_2`), swapped with the first.
        components = {spec.denoiser: unet, **(more or {})}
        self.table = TargetTable(components, denoiser=spec.denoiser, convert_lora=spec.convert_lora)
        second = frozenset(
            i for i, name in enumerate(self.table.names) if name.startswith(f"{spec.second_stage or '-'}.")
        )
        # As the engine: pristine copies on the compute device; a device tier only off the CPU, where the
        # host copy is kept in the compute dtype instead.
        self.patcher = WeightPatcher(self.table.params, device, second=second)
        self.store = AdapterStore(
            host_budget=cache_bytes,
            device_budget=cache_bytes,
            device=device,
            dtype=dtype,
            use_device_tier=device.type != "cpu",
        )
        self._max_rank = max_rank

    def prepare(self, path: Path, name: str) -> PreparedAdapter:
        """What the engine does with a file it has not seen: read the header, then convert and map the tensors."""
        header = read_header(path)
        key = AdapterKey("bench", name, _REVISION, path.name)
        return prepare(
            path,
            key,
            self.table,
            max_rank=self._max_rank,
            metadata=header.metadata,
            shapes={tensor: info.shape for tensor, info in header.tensors.items()},
        )

    def swap(self, adapter: PreparedAdapter) -> None:
        """Serve `adapter` alone at scale 1, as `Engine._swap` does."""
        compute = self.store.for_compute(adapter)
        self.patcher.apply((ActiveAdapter(compute, 1.0),))
        self.store.set_active([adapter.key])

    def first_seen(self, path: Path, name: str, clock: Clock) -> tuple[float, float, float]:
        """Milliseconds to prepare a new file, to keep it (host and device tier) and to apply it."""
        started = clock()
        adapter = self.prepare(path, name)
        prepared = clock()
        kept = self.store.add(adapter)
        compute = self.store.for_compute(kept)
        moved = clock()
        self.patcher.apply((ActiveAdapter(compute, 1.0),))
        self.store.set_active([kept.key])
        applied = clock()
        return (prepared - started) * 1000, (moved - prepared) * 1000, (applied - moved) * 1000

    def reset(self) -> None:
        """Serve the base weights again and drop the pristine copies and cached adapters."""
        self.patcher.restore_all()
        self.patcher.forget_pristine()
        self.store.set_active([])


Factors = tuple[tuple[int, torch.Tensor, torch.Tensor, float], ...]
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor], None]


def _accumulate(weight: torch.Tensor, pristine: torch.Tensor, up, down, alpha: float, acc: torch.Tensor) -> None:
    """float32 accumulator: copy the pristine weight in, `addmm_`, round into the weight once."""
    rows = weight.shape[0]
    if weight.dtype == torch.float32:
        weight.copy_(pristine)
        weight.view(rows, -1).addmm_(up, down, alpha=alpha)
        return
    work = acc[: weight.numel()].view(rows, -1)
    work.copy_(pristine.view(rows, -1))
    work.addmm_(up, down, alpha=alpha)
    weight.view(rows, -1).copy_(work)


def _out_of_place(weight: torch.Tensor, pristine: torch.Tensor, up, down, alpha: float, acc: torch.Tensor) -> None:
    """`addmm` from the pristine weight into a new float32 tensor (or straight into a float32 weight), then round."""
    rows = weight.shape[0]
    if weight.dtype == torch.float32:
        torch.addmm(pristine.view(rows, -1), up, down, alpha=alpha, out=weight.view(rows, -1))
        return
    weight.view(rows, -1).copy_(torch.addmm(pristine.view(rows, -1).float(), up, down, alpha=alpha))


# Plain-tensor ways to reach round(W0 + alpha · up @ down) with ΔW in float32, rounded once: the weights the engine
# makes. The floor times them and keeps the fastest that gives bit-identical weights.
KERNELS: dict[str, Kernel] = {"float32 accumulator": _accumulate, "out-of-place addmm": _out_of_place}


class Floor:
    """The least work an exact fused swap does: each touched weight from its pristine copy plus ΔW, rounded once.

    No adapter objects, no store, no plan: the factors are prepared in float32 on the weight's device
    outside any timing, and each layer is one kernel call. So what it leaves out, and ours pays, is: the
    factors' float32 cast (ours casts a set's float16 factors per swap, in one `torch.cat`), the overflow check (ours
    reads a fused weight back only where its bounds say it could overflow: never for the benchmark's LoRAs),
    and the store's and the plan's bookkeeping. `choose` measures the kernels in `KERNELS`
    on this machine and keeps the fastest (they give bit-identical weights; one that does not is dropped).
    """

    def __init__(
        self, params: Sequence[torch.Tensor], touched: Iterable[int], pristine: Mapping[int, torch.Tensor] | None = None
    ) -> None:
        self._params = list(params)
        # The patcher's pristine copies hold the same base values; sharing them keeps one copy of the weights
        # in memory instead of two (a full-size SDXL run is otherwise 2 GiB nearer to running out).
        self._pristine = (
            {index: pristine[index] for index in sorted(set(touched))}
            if pristine is not None
            else {index: self._params[index].detach().clone() for index in sorted(set(touched))}
        )
        self._fused: Factors = ()
        largest = max((t.numel() for t in self._pristine.values()), default=0)
        device = next(iter(self._pristine.values())).device if self._pristine else torch.device("cpu")
        self._acc = torch.empty(largest, dtype=torch.float32, device=device)
        self.kernel = "float32 accumulator"
        self.timings: dict[str, float] = {}

    @property
    def pristine_bytes(self) -> int:
        return sum(t.nbytes for t in self._pristine.values())

    def factors(self, adapter: PreparedAdapter) -> Factors:
        """The adapter's factors in float32 on each weight's device, made once, outside any timing."""
        factors = []
        for layer in adapter.layers:
            assert isinstance(layer, LayerFactors), "the floor fuses plain low-rank factors"
            weight = self._params[layer.target]
            up = layer.up.to(device=weight.device, dtype=torch.float32)
            down = layer.down.to(device=weight.device, dtype=torch.float32)
            factors.append((layer.target, up, down, layer.scaling))
        return tuple(factors)

    @torch.no_grad()
    def choose(self, factors: Factors, clock: Clock, rounds: int = 2) -> str:
        """Time every kernel over `factors` (best of `rounds`), keep the fastest that matches the first; restores."""
        reference: list[torch.Tensor] | None = None
        for name in KERNELS:
            self.kernel = name
            times = []
            for _ in range(rounds):
                started = clock()
                self.swap(factors)
                times.append((clock() - started) * 1000)
            result = [self._params[index].detach().clone() for index, *_ in factors[:4]]
            if reference is None:
                reference = result
            elif not all(torch.equal(a, b) for a, b in zip(reference, result, strict=True)):
                continue  # reaches other weights: not a way to the same weights
            self.timings[name] = min(times)
        self.restore()
        self.kernel = min(self.timings, key=self.timings.__getitem__)
        return self.kernel

    @torch.no_grad()
    def swap(self, factors: Factors) -> None:
        kernel = KERNELS[self.kernel]
        fusing = {index for index, *_ in factors}
        for index, *_ in self._fused:
            if index not in fusing:
                self._params[index].copy_(self._pristine[index])
        for index, up, down, alpha in factors:
            kernel(self._params[index], self._pristine[index], up, down, alpha, self._acc)
        self._fused = factors

    @torch.no_grad()
    def restore(self) -> None:
        self.swap(())
