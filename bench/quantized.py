"""The quantized-pool benchmark: LoRAs as branches beside fp8 weights against LoRAs fused into bf16, side by side.

    python -m bench.quantized [--family flux|wan|krea2] [--storage fp8|int4|gguf-q8_0|gguf-q4_k] [--ranks 16,64]
        [--repeats N] [--tokens N] [--max-rank N] [--threads N] [--quick]

`--storage gguf-*` runs `bench.quantized_gguf` instead (a GGUF slice, against diffusers' GGUF + PEFT as well).
`--family wan` measures the same on Wan's 14B video transformer slice (`bench.quantized_slices`: 2 blocks at width
5120, every block linear adapted; a step of `--tokens` video tokens over 4 latent frames), fp8 or int4;
`--family krea2` on Krea 2's (2 blocks at width 6144, every block linear adapted; `--tokens` image tokens and the
pipeline's 512 text tokens), fp8 or int4.

On a real-width slice of FLUX.1's transformer (`bench.flux_slice`: 2 double and 4 single blocks at width 3072,
every BFL linear adapted, diffusers' names), built twice from one pool of random values: once in bf16, swapped by
the engine's fused path (`WeightPatcher`), once stored in fp8 with branches of `--max-rank` (LORA_MAX_RANK,
default 128), swapped by the engine's branch path (`BranchedPatcher`). It measures, taking turns so that load
from other processes falls on both alike:

- swap time: a branch swap (factors copied into the buffers) against a fused swap (each weight rewritten);
- step time: one eager forward of the slice at `--tokens` image tokens (+ a quarter as many text tokens), fp8
  with a rank-64 branch against bf16 with the same LoRA fused (the compiled figure is not measured here:
  inductor takes many minutes for the slice on 2 cores);
- quality: per adapted layer, on 64 random tokens, the output's relative error against bf16 fused, for the
  branch and for the LoRA fused into fp8 (the fused bf16 weight quantized as the base is), and the error of
  the LoRA's change to the output against float32's `x·ΔWᵀ` for each of the three; after the slice, the
  output's relative error against bf16 fused for the branch and for fp8 fused;
- exactness: the fp8 stored bytes after every swap equal those loaded, and the bf16 slice is its fill again;
- against diffusers: our step with the LoRA as a branch over diffusers' own on the same storage (the slice
  quantized by torchao, the LoRA loaded unfused through PEFT), taking turns (`step_vs_diffusers`; `refused`
  where diffusers cannot load the LoRA there).

On a CPU the step ratio has a floor that depends on the tokens: with no fp8 arithmetic, every call widens every
weight value (4 vector passes, about 0.25 ns per value on one EPYC core, in cache: `BranchedLinear` widens 512
rows at a time), against a bf16 matmul's ~2 ns per value at 320 tokens. So 1.2-1.3x on the slice's 320-token
layers (1.1-1.15x at 1280), 2-3x on its 1-token modulation linears: the step's ratio falls as `--tokens` grows
(a 1024² FLUX image has 4096 + 512). Under load, prefer `--threads 1` for a ratio: that path runs ~5 parallel ops
per 512 rows, and each waits on any descheduled OpenMP worker, where the bf16 matmul is one op per layer.

The default run fits about 15 minutes on 2 loaded cores; --quick is a smoke run (rank 16, 256 tokens). The last
line is `quantized: family=flux|wan|krea2 storage=fp8 swap_ms= swap_vs_fused= step_vs_bf16_fused= step_vs_diffusers=
branch_rel_err= fused_fp8_rel_err= exact=` at rank 64 (the largest rank measured), swap and step ratios medians of
turn-by-turn ratios, errors after the slice. `--storage int4` stores the slice as `engine.weights.int4` does
(groups of 128; `x_embedder`, 64 wide, stays bf16) and measures the same, `fused_fp8_rel_err` then the LoRA fused
into int4.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/quantized.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import diffusers
import torch
import torch.nn.functional as F

from bench.measure import Clock, cpu_description
from bench.ours import Ours, round_robin
from bench.quantized_gguf import GGUF_STORAGES, run_gguf
from bench.quantized_slices import SLICES
from bench.sdxl_unet import mismatched_tensors
from bench.swap import _cpu_pressure
from engine.formats.layers import LayerFactors
from engine.weights.branches import BranchedPatcher, Branches
from engine.weights.int4 import Int4Linear, quantize_denoiser_int4
from engine.weights.quantized import BranchedLinear, quantize_denoiser, stored_bytes

__all__ = ["main", "run"]

DTYPE = torch.bfloat16
ERROR_TOKENS = 64
INT4_GROUP = 128  # INT4_GROUP_SIZE's default


@dataclass(frozen=True)
class Args:
    ranks: tuple[int, ...]
    repeats: int
    tokens: int
    max_rank: int
    quick: bool
    storage: str = "fp8"
    family: str = "flux"


def _say(text: str) -> None:
    print(text, flush=True)


def parse(argv: Sequence[str] | None) -> Args:
    parser = argparse.ArgumentParser(prog="python -m bench.quantized", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", default=None, help="LoRA ranks (default 16,64; --quick: 16)")
    parser.add_argument("--repeats", type=int, default=None, help="timed swaps and steps each (default 4; quick 2)")
    parser.add_argument("--tokens", type=int, default=None, help="image tokens of a step (default 1024; quick 256)")
    parser.add_argument("--max-rank", type=int, default=128, help="the branch buffers' rank (LORA_MAX_RANK)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own choice)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: rank 16, 256 tokens, 2 repeats")
    parser.add_argument("--storage", default="fp8", choices=["fp8", "int4", *GGUF_STORAGES], help="the base's storage")
    parser.add_argument("--family", default="flux", choices=sorted(SLICES), help="the slice's family (default flux)")
    args = parser.parse_args(argv)
    if args.family != "flux" and args.storage in GGUF_STORAGES:
        parser.error(
            f"--storage {args.storage} is measured on FLUX.1's slice only; accepted with --family "
            f"{args.family}: fp8, int4"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    ranks = tuple(int(r) for r in args.ranks.split(",")) if args.ranks else ((16,) if args.quick else (16, 64))
    if max(ranks) > args.max_rank:
        parser.error(f"--ranks {max(ranks)} is over --max-rank {args.max_rank}; accepted: ranks up to it")
    repeats = args.repeats or (2 if args.quick else 4)
    tokens = args.tokens or (256 if args.quick else 1024)
    return Args(ranks, repeats, tokens, args.max_rank, args.quick, args.storage, args.family)


def run(args: Args) -> dict[str, object]:
    began = time.perf_counter()
    clock = Clock(torch.device("cpu"))
    cpu, _ = cpu_description()
    chosen = SLICES[args.family]
    _say(f"quantized benchmark: {chosen.label}, random weights")
    _say(f"CPU: {cpu}; torch {torch.__version__}, diffusers {diffusers.__version__}, {torch.get_num_threads()} threads")
    _say(f"machine: {_cpu_pressure()}")
    pool = chosen.pool()
    bf16 = chosen.build(dtype=DTYPE, device=torch.device("cpu"), pool=pool)
    fp8 = chosen.build(dtype=DTYPE, device=torch.device("cpu"), pool=pool)
    started = time.perf_counter()
    if args.storage == "int4":
        quantize_denoiser_int4(fp8, rank=args.max_rank, dtype=DTYPE, group_size=INT4_GROUP)
    else:
        quantize_denoiser(fp8, rank=args.max_rank, dtype=DTYPE)
    loaded_bytes = stored_bytes(fp8)
    stored = sum(p.nbytes for p in fp8.parameters()) + sum(b.nbytes for b in fp8.buffers())
    _say(
        f"built both: {sum(p.numel() for p in bf16.parameters()) / 1e9:.2f}B parameters, bf16 "
        f"{sum(p.nbytes for p in bf16.parameters()) / 2**30:.2f} GiB, {args.storage} with rank-{args.max_rank} "
        f"branches {stored / 2**30:.2f} GiB (quantized in {time.perf_counter() - started:.1f} s)"
    )
    options: dict[str, Any] = {"device": torch.device("cpu"), "dtype": DTYPE, "max_rank": 256, "cache_bytes": 8 * 2**30}
    fused = Ours(bf16, family=chosen.family, **options)
    branch = Ours(fp8, family=chosen.family, **options)
    branch.patcher = BranchedPatcher(branch.patcher, Branches(branch.table, fp8))  # type: ignore[assignment]
    results: dict[str, object] = {"cpu": cpu}
    with tempfile.TemporaryDirectory(prefix="quantized-bench-") as folder:
        for rank in args.ranks:
            pair = chosen.pair(Path(folder), bf16, rank)
            sides = {
                name: [o.prepare(p, f"r{rank}-{i}") for i, p in enumerate(pair.paths)]
                for name, o in (("fused", fused), ("branch", branch))
            }
            results[f"swap_r{rank}"] = _swaps(fused, branch, sides, args.repeats, clock, rank)
            results[f"layers_r{rank}"] = _layer_errors(fused, branch, sides, rank)
            if rank == max(args.ranks):
                results["step"] = _steps(fused, branch, sides, args, clock)
                branch.swap(sides["branch"][0])  # `_steps` leaves it reset
                results["diffusers"] = _versus_diffusers(pool, pair.paths[0], branch, args, clock)
    fused.reset()
    branch.reset()
    exact = stored_bytes(fp8) == loaded_bytes and not mismatched_tensors(bf16, pool)
    _say(f"machine: {_cpu_pressure()}; the whole run took {time.perf_counter() - began:.0f} s")
    _last_line(results, max(args.ranks), exact, args)
    return results


def _swaps(fused: Ours, branch: Ours, sides: dict, repeats: int, clock: Clock, rank: int) -> dict[str, float]:
    swaps = {
        name: (lambda i, o=o, a=sides[name]: o.swap(a[i % 2])) for name, o in (("fused", fused), ("branch", branch))
    }
    samples = round_robin(clock, swaps, repeats)
    ratios = [b / f for b, f in zip(samples["branch"], samples["fused"], strict=True)]
    out = {
        "fused_ms": statistics.median(samples["fused"]),
        "branch_ms": statistics.median(samples["branch"]),
        "ratio": statistics.median(ratios),
    }
    _say(
        f"rank {rank:3d} swap: branch {out['branch_ms']:8.1f} ms, bf16 fused {out['fused_ms']:8.1f} ms, "
        f"branch/fused {out['ratio']:.3f} (median of {repeats} turns)"
    )
    return out


@torch.no_grad()
def _layer_errors(fused: Ours, branch: Ours, sides: dict, rank: int) -> dict[str, float]:
    """Per adapted layer (LoRA "a" served on both sides): output errors against bf16 fused, change errors against
    float32; medians and maxima over the layers."""
    fused.swap(sides["fused"][0])
    branch.swap(sides["branch"][0])
    modules = dict(branch.unet.named_modules())
    plain = dict(fused.unet.named_modules())
    rows: dict[str, list[float]] = {k: [] for k in ("branch_out", "fp8_out", "branch_dw", "bf16_dw", "fp8_dw")}
    generator = torch.Generator().manual_seed(rank)
    for layer in sides["branch"][0].layers:
        assert isinstance(layer, LayerFactors)
        name = branch.table.names[layer.target].removeprefix("transformer.")
        q, linear = modules[name], plain[name]
        assert isinstance(q, BranchedLinear)
        x = torch.randn(ERROR_TOKENS, q.in_features, generator=generator).to(DTYPE)
        truth = (x.float() @ layer.down.float().T) @ layer.up.float().T * layer.scaling
        pristine = fused.patcher.pristine_copies([layer.target])[layer.target]
        y_fused, y_base = F.linear(x, linear.weight, linear.bias), F.linear(x, pristine, linear.bias)
        q_base = F.linear(x, q.dequantized(DTYPE), q.bias)
        fp8_fused = _stored_like(q, linear.weight, linear.bias)
        y_fp8 = F.linear(x, fp8_fused.dequantized(DTYPE), q.bias)
        y_branch = q(x)
        rows["branch_out"].append(_rel(y_branch, y_fused))
        rows["fp8_out"].append(_rel(y_fp8, y_fused))
        rows["branch_dw"].append(_rel(y_branch.float() - q_base.float(), truth))
        rows["bf16_dw"].append(_rel(y_fused.float() - y_base.float(), truth))
        rows["fp8_dw"].append(_rel(y_fp8.float() - q_base.float(), truth))
    summary = {f"{k}_median": statistics.median(v) for k, v in rows.items()}
    summary |= {f"{k}_max": max(v) for k, v in rows.items()}
    _say(
        f"rank {rank:3d} per layer ({len(rows['branch_out'])} layers), median (max): output vs bf16 fused: branch "
        f"{summary['branch_out_median']:.4f} ({summary['branch_out_max']:.4f}), fp8 fused "
        f"{summary['fp8_out_median']:.4f} ({summary['fp8_out_max']:.4f}); LoRA's change vs float32: branch "
        f"{summary['branch_dw_median']:.4f} ({summary['branch_dw_max']:.4f}), bf16 fused "
        f"{summary['bf16_dw_median']:.4f} ({summary['bf16_dw_max']:.4f}), fp8 fused "
        f"{summary['fp8_dw_median']:.4f} ({summary['fp8_dw_max']:.4f})"
    )
    return summary


def _rel(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.double(), reference.double()
    return float((value - reference).norm() / reference.norm())


def _inputs(tokens: int, family: str = "flux") -> dict[str, object]:
    return SLICES[family].inputs(tokens, DTYPE)


@torch.no_grad()
def _steps(fused: Ours, branch: Ours, sides: dict, args: Args, clock: Clock) -> dict[str, float]:
    """Eager steps at the headline rank, taking turns; then the slice's output errors against bf16 fused."""
    fused.swap(sides["fused"][0])
    branch.swap(sides["branch"][0])
    inputs = _inputs(args.tokens, args.family)
    outputs: dict[str, torch.Tensor] = {}

    def step(name: str, model: torch.nn.Module):  # type: ignore[no-untyped-def]
        return lambda _: outputs.__setitem__(name, model(**inputs)[0])

    samples = round_robin(
        clock, {"fused": step("fused", fused.unet), "branch": step("branch", branch.unet)}, args.repeats
    )
    ratios = [b / f for b, f in zip(samples["branch"], samples["fused"], strict=True)]
    started = clock()
    for module in branch.unet.modules():
        if isinstance(module, BranchedLinear):
            module.dequantized(DTYPE)
    dequantize_ms = (clock() - started) * 1000
    outputs["fp8_fused"] = _fp8_fused_output(fused, branch, inputs)
    out = {
        "fused_ms": statistics.median(samples["fused"]),
        "branch_ms": statistics.median(samples["branch"]),
        "ratio": statistics.median(ratios),
        "dequantize_ms": dequantize_ms,
        "branch_rel_err": _rel(outputs["branch"], outputs["fused"]),
        "fused_fp8_rel_err": _rel(outputs["fp8_fused"], outputs["fused"]),
    }
    _say(
        f"step ({args.tokens} {'video' if args.family == 'wan' else 'image'} tokens, rank {max(args.ranks)}, "
        f"branches of {args.max_rank}): {args.storage} + branch {out['branch_ms']:.0f} ms, "
        f"bf16 fused {out['fused_ms']:.0f} ms, ratio {out['ratio']:.3f}; widening every {args.storage} weight "
        f"whole, once, took {dequantize_ms:.0f} ms (a step widens 512 rows at a time instead)"
    )
    _say(f"slice output vs bf16 fused: branch {out['branch_rel_err']:.4f}, fp8 fused {out['fused_fp8_rel_err']:.4f}")
    return out


@torch.no_grad()
def _versus_diffusers(pool: torch.Tensor, path: Path, branch: Ours, args: Args, clock: Clock) -> float | str:
    """Our step (LoRA "a" as a branch) over diffusers' own on the same storage: the slice quantized by torchao
    (`Float8WeightOnlyConfig`; int4: `PrototypeInt4WeightOnlyConfig`, its CPU kernel) with the same LoRA loaded
    unfused through PEFT (`load_lora_adapter`), taking turns; "refused" where diffusers cannot load it."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    theirs: Any = SLICES[args.family].build(dtype=DTYPE, device=torch.device("cpu"), pool=pool)
    config = (
        PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP) if args.storage == "int4" else Float8WeightOnlyConfig()
    )
    try:
        quantize_(theirs, config)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
            theirs.load_lora_adapter(str(path), prefix="transformer", adapter_name="a")
    except Exception as error:  # what diffusers raises is the answer here, said in the line
        _say(f"diffusers on {args.storage} refused the LoRA: {type(error).__name__}: {error}")
        return "refused"
    inputs = _inputs(args.tokens, args.family)
    steps = {"ours": lambda _: branch.unet(**inputs), "diffusers": lambda _: theirs(**inputs)}
    samples = round_robin(clock, steps, args.repeats)
    ratio = statistics.median(o / d for o, d in zip(samples["ours"], samples["diffusers"], strict=True))
    _say(
        f"step vs diffusers on {args.storage} with the LoRA unfused (PEFT): ours "
        f"{statistics.median(samples['ours']):.0f} ms, diffusers {statistics.median(samples['diffusers']):.0f} ms, "
        f"ratio {ratio:.3f}"
    )
    return ratio


def _fp8_fused_output(fused: Ours, branch: Ours, inputs: dict[str, object]) -> torch.Tensor:
    """The slice's output with the fused bf16 weights quantized as the base is (the LoRA fused into fp8): the fp8
    model's stored tensors are set aside, never written, and put back after."""
    branch.reset()
    plain = dict(fused.unet.named_modules())
    kept = {}
    for name, module in branch.unet.named_modules():
        if isinstance(module, BranchedLinear):
            fp8 = _stored_like(module, plain[name].weight, None)
            kept[name] = {part: getattr(module, part) for part in module.STORED}
            for part in module.STORED:
                setattr(module, part, getattr(fp8, part))
    try:
        return branch.unet(**inputs)[0]
    finally:
        for name, parts in kept.items():
            module = branch.unet.get_submodule(name)
            for part, tensor in parts.items():
                setattr(module, part, tensor)


def _stored_like(module: BranchedLinear, weight: torch.Tensor, bias: torch.Tensor | None) -> BranchedLinear:
    """`weight` stored as `module` stores its own (fp8, int4, or kept in the compute dtype), with no branch."""
    linear: Any = SimpleNamespace(
        in_features=module.in_features, out_features=module.out_features, weight=weight, bias=bias
    )
    if isinstance(module, Int4Linear):
        return Int4Linear(linear, 1, DTYPE, group_size=module.group_size)
    return BranchedLinear(linear, 1, DTYPE, quantize=module.weight.dtype == torch.float8_e4m3fn)


def _last_line(results: dict[str, object], rank: int, exact: bool, args: Args) -> None:
    swap = results[f"swap_r{rank}"]
    step, diffusers = results["step"], results["diffusers"]
    assert isinstance(swap, dict) and isinstance(step, dict)
    versus = diffusers if isinstance(diffusers, str) else f"{diffusers:.2f}"
    _say(
        f"quantized: family={args.family} storage={args.storage} swap_ms={swap['branch_ms']:.1f} "
        f"swap_vs_fused={swap['ratio']:.3f} "
        f"step_vs_bf16_fused={step['ratio']:.2f} step_vs_diffusers={versus} "
        f"branch_rel_err={step['branch_rel_err']:.4f} fused_fp8_rel_err={step['fused_fp8_rel_err']:.4f} "
        f"exact={'true' if exact else 'false'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse(argv)
    if args.storage in GGUF_STORAGES:
        run_gguf(args, args.storage, _say, _swaps, _inputs, _rel)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
