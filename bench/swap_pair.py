"""`python -m bench.swap --family wan --pair`: Wan 2.2 A14B's swap, both transformers at once.

Two real-width slices of Wan's 14B transformer (`bench.wan_slice`: 2 blocks at width 5120 each), the high-noise
`transformer` and the low-noise `transformer_2`, both filled from one pool (equal values: the timing does not
depend on them, and each is checked against the pool bit for bit), served as one A14B pool: a LoRA file goes to
both (the family's converter gives its factors to each), as the engine's `WeightPatcher` swaps it. Against two
floors, one per transformer (`bench.ours.Floor`: each touched weight from its pristine copy plus ΔW in float32,
rounded once), taking turns swap by swap: `swap_vs_floor` is the median of ours / (high floor + low floor).
The reference (a): diffusers' `load_lora_weights` into each transformer (`load_into_transformer_2=True` for the
low-noise one), `fuse_lora` of both, `unfuse_lora`, `unload_lora_weights`, once per rank and format.
The last line is the other families': `swap_vs_floor=<c/e> swap_vs_reference=<a/c> exact=<true|false>` at the
headline rank, all formats together.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from diffusers import WanPipeline

from bench.measure import Clock, cpu_description
from bench.options import Options
from bench.ours import Floor, Ours, round_robin
from bench.sdxl_unet import mismatched_tensors
from bench.wan_slice import build_wan_slice, reference_wan_pipeline, wan_pool, wan_targets, write_wan_pair
from engine.families.tiny_wan import A14B_BOUNDARY
from lora_catalog.entries import Family

__all__ = ["run_pair"]


def run_pair(
    options: Options,
    say: Callable[[str], None],
    pressure: Callable[[], str],
    *,
    pool: torch.Tensor | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The pair's run (module docstring); `pool` and `config` (default: the slice's) for a narrow test slice."""
    device, dtype = options.device, options.dtype
    began = time.perf_counter()
    clock = Clock(device)
    cpu, _ = cpu_description()
    say(f"swap benchmark, A14B pair: two Wan 14B transformer slices (2 blocks, width 5120 each), {options.dtype_name}")
    say(f"CPU: {cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads; machine: {pressure()}")
    pool = wan_pool() if pool is None else pool
    high = build_wan_slice(dtype=dtype, device=device, pool=pool, config=config)
    low = build_wan_slice(dtype=dtype, device=device, pool=pool, config=config)
    targets = wan_targets(high)
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    files: dict[tuple[int, str], Path] = {}
    with tempfile.TemporaryDirectory(prefix="swap-pair-") as folder:
        for rank in options.ranks:
            for fmt in options.formats:
                pair = write_wan_pair(Path(folder), targets, rank=rank, fmt=fmt)
                files[(rank, fmt)] = pair.paths[0]
                rows[(rank, fmt)] = _measure(high, low, pair.paths, rank, fmt, options, clock, say)
        exact = not mismatched_tensors(high, pool) and not mismatched_tensors(low, pool)
        say(f"our swaps are done; both transformers {'equal' if exact else 'DIFFER FROM'} the pool; {pressure()}")
        for (rank, fmt), row in rows.items():
            row["reference_ms"] = _reference_cycle(high, low, files[(rank, fmt)], clock)
            say(f"rank {rank} {fmt}: diffusers' load + fuse + unfuse + unload on both: {row['reference_ms']:.0f} ms")
    headline = [row for (rank, _), row in rows.items() if rank == options.headline_rank]
    vs_floor = statistics.median(r for row in headline for r in row["ratios"])
    ours_ms = statistics.median(row["ours_ms"] for row in headline)
    vs_reference = statistics.median(row["reference_ms"] for row in headline) / ours_ms
    say(f"machine: {pressure()}; the whole run took {time.perf_counter() - began:.0f} s")
    say(f"swap_vs_floor={vs_floor:.2f} swap_vs_reference={vs_reference:.1f} exact={str(exact).lower()}")
    return {"rows": {f"r{r}-{f}": row for (r, f), row in rows.items()}, "swap_vs_floor": vs_floor, "exact": exact}


def _measure(
    high: torch.nn.Module,
    low: torch.nn.Module,
    paths: tuple[Path, Path],
    rank: int,
    fmt: str,
    options: Options,
    clock: Clock,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Ours (both transformers in one `WeightPatcher.apply`) against each transformer's floor, taking turns."""
    ours = Ours(
        high,
        device=options.device,
        dtype=options.dtype,
        max_rank=max(options.ranks),
        cache_bytes=2**33,
        family=Family.WAN22,
        more={"transformer_2": low},
    )
    adapters = [ours.store.add(ours.prepare(path, f"r{rank}-{fmt}-{i}")) for i, path in enumerate(paths)]
    touched = sorted({layer.target for layer in adapters[0].layers})
    second = ours.patcher.second
    sides = {"high": [i for i in touched if i not in second], "low": [i for i in touched if i in second]}
    assert sides["high"] and sides["low"], "the file must reach both transformers"
    # The patcher takes its pristine copies while the weights are the base; the floors share them.
    ours.swap(adapters[0])
    ours.patcher.restore_all()
    pristine = ours.patcher.pristine_copies(touched)
    floors = {side: Floor(ours.table.params, indices, pristine) for side, indices in sides.items()}
    factors = {
        side: [tuple(f for f in floor.factors(a) if f[0] in set(sides[side])) for a in adapters]
        for side, floor in floors.items()
    }
    for side, floor in floors.items():
        floor.choose(factors[side][0], clock)
    swaps: dict[str, Callable[[int], object]] = {
        f"floor {side}": (lambda i, f=floor, s=side: f.swap(factors[s][i % 2])) for side, floor in floors.items()
    }
    swaps["ours"] = lambda i: ours.swap(adapters[i % 2])
    samples = round_robin(clock, swaps, options.repeats)
    for floor in floors.values():
        floor.restore()
    ours.reset()
    ratios = [o / (h + w) for o, h, w in zip(samples["ours"], samples["floor high"], samples["floor low"], strict=True)]
    row = {
        "ours_ms": statistics.median(samples["ours"]),
        "floor_high_ms": statistics.median(samples["floor high"]),
        "floor_low_ms": statistics.median(samples["floor low"]),
        "ratios": ratios,
    }
    say(
        f"rank {rank} {fmt}: ours on both {row['ours_ms']:.0f} ms, floors {row['floor_high_ms']:.0f} + "
        f"{row['floor_low_ms']:.0f} ms, ours/floors {statistics.median(ratios):.3f} (median of {options.repeats})"
    )
    return row


@torch.no_grad()
def _reference_cycle(high: torch.nn.Module, low: torch.nn.Module, path: Path, clock: Clock) -> float:
    """Milliseconds of diffusers' own cycle on both transformers (a two-stage `WanPipeline` around them)."""
    tiny: Any = reference_wan_pipeline(high)
    pipe: Any = WanPipeline(
        tokenizer=tiny.tokenizer,
        text_encoder=tiny.text_encoder,
        transformer=high,
        vae=tiny.vae,
        scheduler=tiny.scheduler,
        transformer_2=low,
        boundary_ratio=A14B_BOUNDARY,
    )
    started = clock()
    pipe.load_lora_weights(str(path), adapter_name="high")
    pipe.load_lora_weights(str(path), adapter_name="low", load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer", "transformer_2"])
    pipe.unfuse_lora(components=["transformer", "transformer_2"])
    pipe.unload_lora_weights()
    return (clock() - started) * 1000
