"""The swap benchmark's output: the table, the memory and exactness lines, the JSON file, its plot and the last line."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from .formats import FormatsResults
from .measure import Row, format_table
from .options import Options
from .sections import OursResults, ReferenceResults

__all__ = ["Exactness", "report"]

Say = Callable[[str], None]
_MIB = 2**20
_METHOD_ORDER = ("(e)", "(c)", "(g)", "(f)", "(d)", "(b)", "(a)")


@dataclass(frozen=True)
class Exactness:
    """Our swaps against the regenerated base, and the reference cycles' drift from it."""

    exact: bool
    mismatched: int
    drift_max_abs: float
    drift_tensors: int
    reference_cycles: int


def _method_order(row: Row) -> int:
    # Sub-rows ("    (a) load") sort with their method; the sort is stable, so they stay below it.
    stripped = row.method.strip()
    return next(i for i, prefix in enumerate(_METHOD_ORDER) if stripped.startswith(prefix))


def _medians(rows: Sequence[Row], prefix: str) -> dict[tuple[int, str], float]:
    return {(r.rank, r.fmt): r.median_ms for r in rows if r.method.startswith(prefix)}


def _headline(rows: Sequence[Row], rank: int) -> tuple[float, float, float]:
    """(c)/(e), (a)/(c) and the median (c) at `rank`, every format's samples together.

    (c) and (e) took turns, so each (c) swap is compared with the (e) swap beside it: load from
    other processes changes both alike and cancels out of their ratio.
    """
    at_rank = [r for r in rows if r.rank == rank]
    ours = {r.fmt: r.samples_ms for r in at_rank if r.method.startswith("(c) ")}
    floor = {r.fmt: r.samples_ms for r in at_rank if r.method.startswith("(e) ")}
    reference = [s for r in at_rank if r.method == "(a) reference cycle" for s in r.samples_ms]
    paired = [c / e for fmt in ours for c, e in zip(ours[fmt], floor[fmt], strict=True)]
    swaps = [s for samples in ours.values() for s in samples]
    return statistics.median(paired), statistics.median(reference) / statistics.median(swaps), statistics.median(swaps)


def report(
    options: Options,
    environment: Mapping[str, object],
    ours: OursResults,
    reference: ReferenceResults,
    exactness: Exactness,
    say: Say,
    lycoris: FormatsResults | None = None,
    convert_trace: float | None = None,
) -> dict[str, object]:
    """Print everything, write the JSON file if asked, and end with the one-line verdict."""
    formats = {fmt: i for i, fmt in enumerate(options.formats)}
    rows = sorted((*ours.rows, *reference.rows), key=lambda r: (r.rank, formats[r.fmt], _method_order(r)))
    floor_ms = _medians(rows, "(e) ")
    reference_ms = _medians(rows, "(a) reference")
    say("")
    say(format_table(rows, floor_ms, reference_ms))
    say("")
    alone = [r for r in options.ranks if r not in ours.interleaved]
    if alone:
        say(f"ranks {alone}: no room for two pristine copies, so the floor ran alone before ours (not taking turns)")
    for use in ours.memory:
        say(
            f"memory rank {use.rank} {use.fmt}: file {use.file_bytes / _MIB:.1f} MiB; host tier "
            f"{use.host_tier_over_file:.2f}x the file; host RAM in all {use.host_ram_over_file:.2f}x "
            "(target <= 1.1x)"
        )
    if ours.rss is not None:
        rss = ours.rss
        say(
            f"RSS across {rss.swaps} swaps of ours (rank {rss.rank}): {rss.before / _MIB:.0f} -> "
            f"{rss.after / _MIB:.0f} MiB ({rss.growth_mib:+.1f} MiB, {rss.growth_percent:+.2f}%)"
        )
    say(
        f"exact: {str(exactness.exact).lower()} (every model tensor bit-compared with its regenerated value after "
        f"all of our swaps; {exactness.mismatched} differ)"
    )
    say(
        f"reference drift after {exactness.reference_cycles} cycles (all ranks and formats, one after another): "
        f"max |W - W0| = {exactness.drift_max_abs:.3g} in {exactness.drift_tensors} tensors"
    )
    lycoris_summary = _report_formats(lycoris, options, say) if lycoris is not None else []
    rank = options.headline_rank
    vs_floor, vs_reference, swap_ms = _headline(rows, rank)
    targets = "(c) <= 50 ms" if options.device.type == "cuda" else "(c)/(e) <= 1.25, (a)/(c) >= 5"
    say(
        f"headline: rank {rank}, {options.dtype_name} on {options.device}, all formats: (c) {swap_ms:.1f} ms; "
        f"(c)/(e) {vs_floor:.2f} (median of the swap-by-swap ratios); (a)/(c) {vs_reference:.1f} (ratio of medians); "
        f"targets: {targets}"
    )
    results = {
        "options": options.as_dict(),
        "environment": dict(environment),
        "rows": [r.as_dict() for r in rows],
        "memory": [
            {**asdict(u), "host_tier_over_file": u.host_tier_over_file, "host_ram_over_file": u.host_ram_over_file}
            for u in ours.memory
        ],
        "rss": None if ours.rss is None else {**asdict(ours.rss), "growth_percent": ours.rss.growth_percent},
        "interleaved_ranks": list(ours.interleaved),
        "exactness": asdict(exactness),
        "headline": {"rank": rank, "swap_ms": swap_ms, "swap_vs_floor": vs_floor, "swap_vs_reference": vs_reference},
        "convert_trace_vs_plain": convert_trace,
        "floor_kernels": [{"rank": r, "kernel": k, "best_ms": t} for r, k, t in ours.floor_kernels],
        "lycoris": None
        if lycoris is None
        else {
            "rows": [r.as_dict() for r in lycoris.rows],
            "memory": [asdict(m) for m in lycoris.memory],
            "layers": lycoris.layers,
            "values": lycoris.values,
            "summary": lycoris_summary,
        },
    }
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(results, indent=2))
        say(f"wrote {options.json_path}")
    if options.plot_dir is not None:
        from .plots import save_with_plots  # matplotlib only when plots are asked for

        for path in save_with_plots(results, options.plot_dir, "swap"):
            say(f"wrote {path}")
    traced = "" if convert_trace is None else f" convert_trace_vs_plain={convert_trace:.2f}"
    say(
        f"swap_vs_floor={vs_floor:.2f} swap_vs_reference={vs_reference:.1f} exact={str(exactness.exact).lower()}"
        f"{traced}"
    )
    return results


def _paired(rows: Sequence[Row], rank: int, variant: str, prefix: str) -> float:
    """Median of the swap-by-swap ratios of a method over the floor it took turns with."""
    at = {r.method[:3]: r.samples_ms for r in rows if r.rank == rank and r.fmt == variant}
    return statistics.median(x / e for x, e in zip(at[prefix], at["(e)"], strict=True))


def _report_formats(formats: FormatsResults, options: Options, say: Say) -> list[dict[str, object]]:
    """The LoHa/LoKr/DoRA table, memory per way of keeping ΔW, and the two ways' ratios to the floor."""
    order = {v: i for i, v in enumerate(options.variants)}
    rows = sorted(formats.rows, key=lambda r: (r.rank, order[r.fmt], _method_order(r)))
    say("")
    say(
        f"LoHa/LoKr/DoRA on {formats.layers} attention projections ({formats.values / 1e6:.1f}M values; "
        "kohya names as LyCORIS writes them; the floor is a plain LoRA of the same rank on the same weights)"
    )
    say(format_table(rows, _medians(rows, "(e) "), {}))
    summary = []
    memory = {(m.rank, m.variant): m for m in formats.memory}
    for (rank, variant), use in memory.items():
        recompute, cached = _paired(rows, rank, variant, "(c)"), _paired(rows, rank, variant, "(f)")
        summary.append(
            {
                "rank": rank,
                "variant": variant,
                "recompute_vs_floor": recompute,
                "cached_vs_floor": cached,
                "factors_bytes": use.factors_bytes,
                "cached_bytes": use.cached_bytes,
            }
        )
        say(
            f"{variant} rank {rank}: recompute (c)/(e) {recompute:.2f}, cached ΔW (f)/(e) {cached:.2f}; host tier "
            f"{use.factors_bytes / _MIB:.1f} MiB of factors vs {use.cached_bytes / _MIB:.1f} MiB of float32 ΔW "
            f"({use.cached_bytes / max(use.factors_bytes, 1):.0f}x; file {use.file_bytes / _MIB:.1f} MiB)"
        )
    return summary
