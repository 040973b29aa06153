"""What finding the tensors a converter drops costs: the family's converter (diffusers') run under the tracing mode
(`engine.formats.converted.convert_traced`, what every preparation of a plain LoRA runs) against the converter
alone, on the same file's tensors, taking turns (`bench.swap`'s `convert_trace_vs_plain=`, the median of the
turn-by-turn ratios over the measured files)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from engine.families.registry import spec_for
from engine.formats.converted import convert_traced
from engine.formats.targets import TargetTable
from families import Family

from .measure import Clock
from .ours import round_robin

__all__ = ["measure_convert_trace"]

_TURNS = 15


def measure_convert_trace(
    denoiser: nn.Module, family: Family, files: Iterable[tuple[str, Path]], repeats: int, clock: Clock, say: Callable
) -> float:
    """The median over `files` ((label, path)) of traced / plain conversion times, each taking turns `repeats` times;
    a line per file with both medians and its tensor count."""
    spec = spec_for(family)
    table = TargetTable({spec.denoiser: denoiser}, denoiser=spec.denoiser, convert_lora=spec.convert_lora)
    ratios: list[float] = []
    for label, path in files:
        tensors = load_file(str(path))
        ways = {
            "traced": lambda _, t=tensors: convert_traced(table.convert, t),
            "plain": lambda _, t=tensors: table.convert(dict(t)),  # the converter pops what it reads: a fresh dict
        }
        # A conversion takes milliseconds: many turns, so that one descheduling does not decide the median.
        samples = round_robin(clock, ways, max(repeats, _TURNS))
        turns = [t / p for t, p in zip(samples["traced"], samples["plain"], strict=True)]
        more = statistics.median(t - p for t, p in zip(samples["traced"], samples["plain"], strict=True))
        ratios.extend(turns)
        traced, plain = statistics.median(samples["traced"]), statistics.median(samples["plain"])
        say(
            f"{label} ({len(tensors)} tensors): converter traced {traced:.1f} ms, alone {plain:.1f} ms, "
            f"traced/alone {statistics.median(turns):.2f} (median of {len(turns)} turns); "
            f"{more / len(tensors) * 500:.1f} ms more per 500 tensors (median of the turns' differences)"
        )
    return statistics.median(ratios)
