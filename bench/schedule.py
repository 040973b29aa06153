"""What a LoRA's strength by step costs (issue 51): `python -m bench.swap --schedule`.

    python -m bench.swap --schedule [--device cpu|cuda] [--steps 8] [--repeats 9] [--rank 8]

On the tiny SDXL pipeline (no download), through the engine's own path, with a synthetic LoRA (PEFT names, on the
UNet's attention and both text encoders), two figures:

- `boundary_vs_floor`: one step boundary, the swap a scheduled run makes there (`FusedSet.swap` to the same LoRA
  at the next segment's scale, as `FusedSet.stepper`'s hook calls it) against the floor for the same weights
  (`bench.ours.Floor`: each touched weight from its pristine copy plus ΔW in float32, rounded once), taking turns
  so load from other processes falls on both alike; the median of the swap-by-swap ratios.
- `scheduled_vs_plain`: a request's inference with a schedule of k segments (k - 1 boundaries inside the run)
  against the same request at one scale, taking turns; beside it `bound`, 1 + (k - 1) boundaries' median time
  over the plain run's: the issue's ≤ 1.0 plus k swaps.

The last line is `schedule: boundary_vs_floor=<r> scheduled_vs_plain=<r> bound=<r> boundary_ms=<ms> floor_ms=<ms>
plain_s=<s> scheduled_s=<s> segments=<k>`; the lines before it name the CPU and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.measure import Clock, cpu_description
from bench.ours import Floor
from engine.formats.adapters import PreparedAdapter
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import TINY_MODEL_ID, Settings
from serving.demo.synthetic import TEXT_ATTENTION, UNET_ATTENTION, find_targets, make_lora, peft_metadata, save_lora

__all__ = ["main"]

# k = 3 segments: 1.0 for the first quarter (Forge's SDA example), 0.5 to the middle, 0 after it.
SCHEDULE = ((0.0, 1.0), (0.25, 0.5), (0.5, 0.0))


def _lora(folder: Path, pipe: object, rank: int) -> str:
    encoders = {c: getattr(pipe, c) for c in ("text_encoder", "text_encoder_2")}
    targets = find_targets(
        {"unet": pipe.unet, **encoders}, {"unet": UNET_ATTENTION} | dict.fromkeys(encoders, TEXT_ATTENTION)
    )  # type: ignore[attr-defined]
    save_lora(
        folder / "scheduled.safetensors",
        make_lora(targets, rank=rank, seed=51),
        peft_metadata(targets, rank=rank, alpha=rank),
    )
    return "local:scheduled.safetensors"


def _boundaries(
    engine: Engine, adapter: PreparedAdapter, clock: Clock, repeats: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of each boundary swap and of the floor for the same weights, taking turns."""
    fused = engine._fused  # the engine's one swap, as a scheduled run's hook calls it
    fused.swap(((adapter, 1.0, None),))
    touched = sorted({layer.target for layer in adapter.layers})
    fused.restore_all()
    floor = Floor(engine._table.params, touched, engine._fused._patcher.pristine_copies(touched))
    factors = floor.factors(engine._store.for_compute(adapter))
    floor.choose(factors, clock)
    ours: list[float] = []
    theirs: list[float] = []
    for index in range(repeats + 1):
        started = clock()
        floor.swap(factors)
        floor_ms = (clock() - started) * 1000
        # A boundary: the same LoRA at the next segment's scale (each swap rewrites every touched weight from its
        # pristine copy, so the floor's writes in between change no work of it).
        started = clock()
        fused.swap(((adapter, SCHEDULE[index % len(SCHEDULE)][1], None),))
        if index:  # the first of each is untimed
            ours.append((clock() - started) * 1000)
            theirs.append(floor_ms)
    floor.restore()
    fused.restore_all()
    return ours, theirs


def _runs(engine: Engine, ref: str, steps: int, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of inference of the plain and the scheduled request, taking turns (each after an untimed one)."""
    plain = GenerateRequest("a fox", loras=(LoraSpec(ref, 1.0),), steps=steps, seed=7)
    scheduled = GenerateRequest("a fox", loras=(LoraSpec(ref, schedule=SCHEDULE),), steps=steps, seed=7)
    times: dict[str, list[float]] = {"plain": [], "scheduled": []}
    for index in range(repeats + 1):
        for name, request in (("plain", plain), ("scheduled", scheduled)):
            with engine.prepare(request) as prepared:
                result = engine.run(prepared)
            if index:
                times[name].append(result.timings.inference)
    return times["plain"], times["scheduled"]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} CPUs"


def run(device: str, steps: int, repeats: int, rank: int) -> dict[str, float]:
    cpu, _ = cpu_description()
    print(f"schedule benchmark: tiny SDXL on {device}; CPU: {cpu}; {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="schedule-bench-") as scratch:
        folder = Path(scratch)
        settings = Settings(model_id=TINY_MODEL_ID, device=device, local_lora_dir=folder)
        loaded = load_pipeline(settings, warm=False)
        ref = _lora(folder, loaded.pipe, rank)
        resolver = AdapterResolver(None, local_dir=folder, token=None, max_bytes=settings.max_adapter_bytes)
        engine = Engine(loaded, settings, resolver)
        print(f"loaded the tiny pipeline; {_load()}", flush=True)
        try:
            with engine.prepare(GenerateRequest("a fox", loras=(LoraSpec(ref),))) as prepared:
                adapter = prepared.adapters[0][0]
                ours, floor = _boundaries(engine, adapter, Clock(torch.device(device)), repeats)
            print(
                f"boundaries measured: ours {statistics.median(ours):.2f} ms, floor {statistics.median(floor):.2f} ms"
            )
            plain, scheduled = _runs(engine, ref, steps, repeats)
        finally:
            engine.close()
    boundary, plain_s = statistics.median(ours), statistics.median(plain)
    figures = {
        "boundary_vs_floor": statistics.median(o / f for o, f in zip(ours, floor, strict=True)),
        "scheduled_vs_plain": statistics.median(scheduled) / plain_s,
        "bound": 1 + (len(SCHEDULE) - 1) * boundary / 1000 / plain_s,
        "boundary_ms": boundary,
        "floor_ms": statistics.median(floor),
        "plain_s": plain_s,
        "scheduled_s": statistics.median(scheduled),
        "segments": len(SCHEDULE),
    }
    print(f"machine after: {_load()}", flush=True)
    print("schedule: " + " ".join(f"{k}={v:.3g}" for k, v in figures.items()), flush=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args(argv)
    run(args.device, args.steps, args.repeats, args.rank)
    return 0
