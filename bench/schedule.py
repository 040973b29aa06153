"""What a LoRA's strength by step costs (issue 51): `python -m bench.swap --schedule`.

    python -m bench.swap --schedule [--device cpu|cuda] [--steps 8] [--repeats 9] [--rank 8] [--wide]

On the tiny SDXL pipeline (no download), through the engine's own path, with a synthetic LoRA (PEFT names, on the
UNet's attention and both text encoders), two figures:

- `boundary_vs_floor`: one step boundary, as a scheduled run makes it (the request's own hook,
  `FusedSet.stepper`: the UNet's weights of the LoRA whose scale changes rewritten, the text encoders' left at step
  0's scales) against the floor for the same weights (`bench.ours.Floor`: each of those UNet weights from its
  pristine copy plus ΔW in float32, rounded once, by the fastest plain-tensor kernel), taking turns so load from
  other processes falls on both alike; the median of the boundary-by-boundary ratios.
- `scheduled_vs_plain`: a request's inference with a schedule of k segments (k - 1 boundaries inside the run)
  against the same request at one scale, taking turns; beside it `bound`, 1 + (k - 1) boundaries' median time
  over the plain run's: the issue's ≤ 1.0 plus k swaps.

The last line is `schedule: boundary_vs_floor=<r> scheduled_vs_plain=<r> bound=<r> boundary_ms=<ms> floor_ms=<ms>
plain_s=<s> scheduled_s=<s> segments=<k>`; the lines before it name the CPU and the load. `--wide` puts a UNet of
SDXL's real widths (a few of its transformer layers: `_wide_unet`) in the tiny pipeline and measures the boundary
alone (`boundary_vs_floor`, `boundary_ms`, `floor_ms`): the tiny UNet's 32-wide weights are not what a user's pays.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers import UNet2DConditionModel

from bench.measure import Clock, cpu_description
from bench.ours import Floor
from engine.formats.adapters import PreparedAdapter
from engine.pipeline.loading import load_pipeline
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import TINY_MODEL_ID, Settings
from engine.weights.fused import stepped_weights
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


def _wide_unet(dtype: torch.dtype) -> torch.nn.Module:
    """SDXL's UNet at its real widths (640 and 1280 channels, 2048-wide cross-attention, 10 and 20 heads of 64),
    cut to a few transformer layers: a boundary's per-weight costs at the sizes a user's UNet has, where the tiny
    one's 32-wide weights make fixed costs dominate. Random weights; for the boundary only (the tiny text encoders
    do not fit its cross-attention, so no run)."""
    torch.manual_seed(51)
    unet = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(640, 1280),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=(10, 20),
        transformer_layers_per_block=(1, 2),
        use_linear_projection=True,
        cross_attention_dim=2048,
    )
    return unet.to(dtype)


def _boundaries(
    engine: Engine, adapter: PreparedAdapter, ref: str, clock: Clock, repeats: int
) -> tuple[list[float], list[float], int]:
    """Milliseconds of each boundary and of the floor for the same weights, taking turns; and how many weights
    each boundary writes. A boundary is the scheduled request's own step hook (`FusedSet.stepper`) called at a
    step of the next segment: it rewrites the UNet's weights of the LoRA (its scale changes), not the text
    encoders' (they ran before step 0), and the floor writes exactly those."""
    fused = engine._fused  # the engine's one swap, as a scheduled run's hook calls it
    fused.swap(((adapter, SCHEDULE[0][1], None),))  # step 0's set, as the engine swaps before a run
    hook = fused.stepper((LoraSpec(ref, schedule=SCHEDULE),), ((adapter, SCHEDULE[0][1], None),))
    assert hook is not None
    # A step inside each segment, of a 4-step run: 0 (1.0), 1 (0.5), 2 (0); called in turn, each is a boundary.
    steps = [round(start * 4) for start, _ in SCHEDULE]
    denoiser = stepped_weights(engine._table.names, engine.loaded.family.stored)
    touched = sorted({layer.target for layer in adapter.layers} & denoiser)
    floor = Floor(engine._table.params, touched, fused._patcher.pristine_copies(touched))
    compute = engine._store.for_compute(adapter)
    unet_layers = tuple(layer for layer in compute.layers if layer.target in denoiser)
    factors = floor.factors(dataclasses.replace(compute, layers=unet_layers))
    floor.choose(factors, clock)
    ours: list[float] = []
    theirs: list[float] = []
    for index in range(repeats + 1):
        started = clock()
        floor.swap(factors)
        floor_ms = (clock() - started) * 1000
        # Each boundary rewrites its weights from their pristine copies, so the floor's writes in between change
        # no work of it.
        started = clock()
        hook(steps[(index + 1) % len(steps)], 4)
        if index:  # the first of each is untimed
            ours.append((clock() - started) * 1000)
            theirs.append(floor_ms)
    floor.restore()
    fused.restore_all()
    return ours, theirs, len(touched)


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


def run(device: str, steps: int, repeats: int, rank: int, wide: bool = False) -> dict[str, float]:
    cpu, _ = cpu_description()
    model = "tiny SDXL with a real-width UNet slice (boundaries only)" if wide else "tiny SDXL"
    print(f"schedule benchmark: {model} on {device}; CPU: {cpu}; {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="schedule-bench-") as scratch:
        folder = Path(scratch)
        settings = Settings(model_id=TINY_MODEL_ID, device=device, local_lora_dir=folder)
        loaded = load_pipeline(settings, warm=False)
        if wide:
            loaded.pipe.register_modules(unet=_wide_unet(loaded.dtype).to(device))
        ref = _lora(folder, loaded.pipe, rank)
        resolver = AdapterResolver(None, local_dir=folder, token=None, max_bytes=settings.max_adapter_bytes)
        engine = Engine(loaded, settings, resolver)
        print(f"loaded the pipeline; {_load()}", flush=True)
        try:
            with engine.prepare(GenerateRequest("a fox", loras=(LoraSpec(ref),))) as prepared:
                adapter = prepared.adapters[0][0]
                ours, floor, weights = _boundaries(engine, adapter, ref, Clock(torch.device(device)), repeats)
            print(
                f"boundaries measured: ours {statistics.median(ours):.2f} ms, floor {statistics.median(floor):.2f} ms"
                f" ({weights} UNet weights each, {loaded.dtype}; the text encoders' are not rewritten)",
                flush=True,
            )
            # The slice's UNet does not fit the tiny text encoders: its figures are the boundary's only.
            plain, scheduled = ([1.0], [1.0]) if wide else _runs(engine, ref, steps, repeats)
        finally:
            engine.close()
    figures = _figures(ours, floor, plain, scheduled)
    if wide:
        figures = {k: v for k, v in figures.items() if k in ("boundary_vs_floor", "boundary_ms", "floor_ms")}
    print(f"machine after: {_load()}", flush=True)
    print("schedule: " + " ".join(f"{k}={v:.3g}" for k, v in figures.items()), flush=True)
    return figures


def _figures(ours: list[float], floor: list[float], plain: list[float], scheduled: list[float]) -> dict[str, float]:
    boundary, plain_s = statistics.median(ours), statistics.median(plain)
    return {
        "boundary_vs_floor": statistics.median(o / f for o, f in zip(ours, floor, strict=True)),
        "scheduled_vs_plain": statistics.median(scheduled) / plain_s,
        "bound": 1 + (len(SCHEDULE) - 1) * boundary / 1000 / plain_s,
        "boundary_ms": boundary,
        "floor_ms": statistics.median(floor),
        "plain_s": plain_s,
        "scheduled_s": statistics.median(scheduled),
        "segments": len(SCHEDULE),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--wide", action="store_true", help="the boundary on a real-width SDXL UNet slice")
    args = parser.parse_args(argv)
    run(args.device, args.steps, args.repeats, args.rank, args.wide)
    return 0
