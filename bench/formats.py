"""LoHa, LoKr and DoRA swaps against the floor for the same touched weights, two ways of keeping them.

For each variant and rank, three methods take turns on one UNet, every swap going from one adapter
of a pair to the other:

(e) the floor: a plain LoRA of the same rank on the same weights, by the fastest exact kernel
    (`bench.ours.Floor`) — what any exact low-rank swap of those weights costs;
(c) ours, recomputing ΔW per swap from the factors the store keeps (what the engine does for LoKr, and
    for LoHa and DoRA on a GPU or past its budget): `WeightPatcher.apply` with the layer updates;
(f) ours, ΔW computed once at preparation and kept in float32 (what the engine does for LoHa and DoRA on
    the CPU within a quarter of HOST_CACHE_BYTES, `engine.formats.deltas`): the same patcher with
    `LayerDelta` updates (DoRA still rescales per swap: its norm depends on the request's scale).

The adapters target one in four of SDXL's attention projections, so two cached float32 ΔW fit in
memory next to the UNet; memory per adapter is reported for both ways of keeping it.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from engine.formats.adapters import PreparedAdapter
from engine.formats.dora import DoraUpdate
from engine.formats.layers import LayerDelta, LayerUpdate, Scratch
from engine.weights.swap import ActiveAdapter
from serving.demo.synthetic import LoraTarget, save_lora
from serving.demo.synthetic_lycoris import Variant, lycoris_metadata, make_dora, make_loha, make_lokr

from .measure import Clock, Row
from .ours import Floor, Ours, round_robin, write_pair

__all__ = ["FormatMemory", "FormatsResults", "measure_formats"]

Say = Callable[[str], None]
EVERY = 4  # one in EVERY attention projections
_METHODS = {
    "(e)": ("(e) floor: LoRA of the same rank", "same weights, fastest exact kernel"),
    "(c)": ("(c) ours, ΔW recomputed per swap", "the engine for LoKr (LoHa, DoRA on a GPU)"),
    "(f)": ("(f) ours, ΔW cached in float32", "computed at preparation: the engine for LoHa, DoRA on CPU"),
}


@dataclass(frozen=True)
class FormatMemory:
    rank: int
    variant: str
    file_bytes: int
    factors_bytes: int  # what the host tier keeps when ΔW is recomputed per swap
    cached_bytes: int  # what it would keep with ΔW cached in float32


@dataclass(frozen=True)
class FormatsResults:
    rows: tuple[Row, ...]
    memory: tuple[FormatMemory, ...]
    layers: int
    values: int


def _files(folder: Path, variant: str, targets: Sequence[LoraTarget], unet: nn.Module, rank: int) -> tuple[Path, Path]:
    """Two adapters of `variant` in the kohya names LyCORIS writes (DoRA: LoCon with `dora_scale` per output row)."""
    paths = []
    for name, seed in (("a", 3 * rank + 1), ("b", 3 * rank + 2)):
        if variant == "loha":
            tensors = make_loha(targets, rank=rank, seed=seed)
        elif variant == "lokr":
            tensors = make_lokr(targets, rank=rank, seed=seed)
        else:
            tensors = make_dora(targets, {"unet": unet}, rank=rank, seed=seed, fmt="kohya")
        metadata = lycoris_metadata(cast(Variant, variant), targets, fmt="kohya", rank=rank, alpha=rank)
        paths.append(save_lora(folder / f"{variant}-r{rank}-{name}.safetensors", tensors, metadata))
    return paths[0], paths[1]


def cached_deltas(adapter: PreparedAdapter, params: Sequence[torch.Tensor]) -> PreparedAdapter:
    """The adapter with each layer's ΔW computed now, in float32 on its weight's device (DoRA keeps its rescale)."""
    scratch = Scratch()

    def delta(layer: LayerUpdate) -> LayerDelta:
        weight = params[layer.target]
        acc = torch.zeros((weight.shape[0], weight[0].numel()), dtype=torch.float32, device=weight.device)
        layer.add_to(acc, 1.0, scratch)
        return LayerDelta(layer.target, acc)

    layers: list[LayerUpdate] = []
    for layer in adapter.layers:
        if isinstance(layer, DoraUpdate):
            layers.append(DoraUpdate(layer.target, delta(layer.inner), layer.magnitude, layer.on_output))
        else:
            layers.append(delta(layer))
    return dataclasses.replace(adapter, layers=tuple(layers))


def measure_formats(
    unet: nn.Module, targets: Sequence[LoraTarget], folder: Path, options, clock: Clock, say: Say
) -> FormatsResults:
    subset = list(targets[::EVERY])
    values = sum(torch.Size(t.weight_shape).numel() for t in subset)
    rows: list[Row] = []
    memory: list[FormatMemory] = []
    for rank in options.ranks:
        plain = write_pair(folder, subset, rank=rank, fmt="peft", prefix="subset-")
        for variant in options.variants:
            found, use = _measure(unet, subset, folder, variant, rank, plain.paths, options, clock)
            rows.extend(found)
            memory.append(use)
            gc.collect()
            say(f"{variant} rank {rank}: floor, recomputed and cached ΔW measured")
    return FormatsResults(tuple(rows), tuple(memory), len(subset), values)


def _measure(
    unet: nn.Module,
    subset: Sequence[LoraTarget],
    folder: Path,
    variant: str,
    rank: int,
    plain_paths: tuple[Path, Path],
    options,
    clock: Clock,
) -> tuple[list[Row], FormatMemory]:
    paths = _files(folder, variant, subset, unet, rank)
    ours = Ours(unet, device=options.device, dtype=options.dtype, max_rank=max(options.ranks), cache_bytes=2**34)
    adapters = [ours.store.add(ours.prepare(path, path.stem)) for path in paths]
    compute = [ours.store.for_compute(a) for a in adapters]
    cached = [cached_deltas(a, ours.table.params) for a in compute]
    plain = [ours.prepare(path, path.stem) for path in plain_paths]
    touched = sorted({layer.target for layer in adapters[0].layers})
    assert touched == sorted({layer.target for layer in plain[0].layers}), "the floor must touch the same weights"
    # The patcher copies each weight the first time it touches it, while the weights are still the base.
    ours.patcher.apply((ActiveAdapter(compute[0], 1.0),))
    ours.patcher.restore_all()
    floor = Floor(ours.table.params, touched, ours.patcher.pristine_copies(touched))
    floor_factors = [floor.factors(a) for a in plain]
    floor.choose(floor_factors[0], clock)
    swaps = {
        "(e)": lambda i: floor.swap(floor_factors[i % 2]),
        "(c)": lambda i: ours.patcher.apply((ActiveAdapter(compute[i % 2], 1.0),)),
        "(f)": lambda i: ours.patcher.apply((ActiveAdapter(cached[i % 2], 1.0),)),
    }
    samples = round_robin(clock, swaps, options.repeats)
    floor.restore()
    ours.reset()
    rows = [
        Row(rank, variant, name, tuple(samples[key]), f"{note}; {floor.kernel}" if key == "(e)" else note)
        for key, (name, note) in _METHODS.items()
    ]
    cached_bytes = sum(t.nbytes for layer in cached[0].layers for t in layer.tensors)
    use = FormatMemory(rank, variant, paths[0].stat().st_size, adapters[0].nbytes, cached_bytes)
    return rows, use
