"""`python -m bench.quantized --storage gguf-q8_0|gguf-q4_k`: LoRAs as branches beside GGUF blocks, against LoRAs
fused into bf16 and against diffusers' own GGUF model with the LoRA loaded through PEFT (unfused), side by side.

On a real-width slice of FLUX.1's transformer (`bench.flux_slice`'s config with 1 double and 2 single blocks, so
that three copies fit a loaded 23 GB machine), filled from one pool of random values, written once as a GGUF file
in the type asked (`tests.support.gguf.write_gguf`: Q8_0 by `gguf.quants`, Q4_K packed there; norms' linears in
F32, as published files keep them), and read back twice by diffusers (`from_single_file` with
`GGUFQuantizationConfig`, bf16 compute): once branched as a pool loads it (`engine.weights.gguf`), once left as
diffusers' `GGUFLinear`s with the LoRA loaded by `load_lora_adapter` (PEFT, unfused). Taking turns it measures:

- swap time: a branch swap against a fused bf16 swap (`WeightPatcher`), rank `--ranks`' largest;
- step time: one eager forward at `--tokens` image tokens, ours (GGUF + branch) against bf16 fused
  (`step_vs_bf16_fused`) and against diffusers' GGUF + PEFT (`step_vs_diffusers`);
- output: ours against diffusers' (the same blocks widened by the same functions: float rounding apart) and
  against bf16 fused;
- exactness: the GGUF blocks after every swap equal those loaded.

On a CPU `step_vs_bf16_fused` has a floor: every call widens every stored value through diffusers' torch
dequantization (several tensor passes per value, in float16 then the compute dtype), against a bf16 matmul
reading each value once; diffusers' own GGUF step pays the same widening, so `step_vs_diffusers` is ours against
that: the branch against PEFT's LoRA layer.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import diffusers
import torch
from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

from bench.flux_slice import FLUX_SLICE_CONFIG, build_flux_slice, flux_pool, flux_targets, write_flux_pair
from bench.measure import Clock, cpu_description
from bench.ours import Ours, round_robin
from bench.swap import _cpu_pressure
from engine.weights.branches import BranchedPatcher, Branches
from engine.weights.gguf import branch_gguf_denoiser, gguf_quant_types, load_gguf_denoiser
from engine.weights.quantized import stored_bytes
from lora_catalog.entries import Family

__all__ = ["GGUF_STORAGES", "run_gguf"]

DTYPE = torch.bfloat16
# --storage's GGUF choices and the block type each writes.
GGUF_STORAGES = {"gguf-q8_0": "Q8_0", "gguf-q4_k": "Q4_K"}
CONFIG = {**FLUX_SLICE_CONFIG, "num_layers": 1, "num_single_layers": 2}


def run_gguf(args: Any, storage: str, say: Any, swaps: Any, inputs: Any, rel: Any) -> dict[str, object]:
    """The GGUF run of `bench.quantized` (its `_swaps`, `_inputs`, `_rel` passed in); prints its last line."""
    from tests.support.gguf import Q, write_gguf

    clock = Clock(torch.device("cpu"))
    cpu, _ = cpu_description()
    say(f"quantized benchmark, {storage}: FLUX.1 transformer slice (1 double + 2 single blocks, width 3072)")
    say(f"CPU: {cpu}; torch {torch.__version__}, diffusers {diffusers.__version__}, {torch.get_num_threads()} threads")
    say(f"machine: {_cpu_pressure()}")
    began = time.perf_counter()
    bf16 = build_flux_slice(dtype=DTYPE, device=torch.device("cpu"), pool=flux_pool(), config=CONFIG)
    rank = max(args.ranks)
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as folder:
        started = time.perf_counter()
        path = write_gguf(Path(folder) / "slice.gguf", bf16.state_dict(), Q[GGUF_STORAGES[storage]], plain=("norm.",))
        say(f"wrote {path.stat().st_size / 2**30:.2f} GiB of GGUF in {time.perf_counter() - started:.0f} s")
        ours_model = load_gguf_denoiser(path, FluxTransformer2DModel, bf16, "transformer", DTYPE)
        branch_gguf_denoiser(ours_model, rank=args.max_rank, dtype=DTYPE)
        theirs = FluxTransformer2DModel.from_single_file(
            str(path),
            config=_config_folder(bf16, Path(folder)),
            subfolder="transformer",
            quantization_config=GGUFQuantizationConfig(compute_dtype=DTYPE),
            torch_dtype=DTYPE,
        )
        say(f"GGUF slice: {gguf_quant_types(ours_model)}")
        loaded = stored_bytes(ours_model)
        fused = Ours(
            bf16, device=torch.device("cpu"), dtype=DTYPE, max_rank=256, cache_bytes=8 * 2**30, family=Family.FLUX
        )
        ours = Ours(
            ours_model, device=torch.device("cpu"), dtype=DTYPE, max_rank=256, cache_bytes=8 * 2**30, family=Family.FLUX
        )
        ours.patcher = BranchedPatcher(ours.patcher, Branches(ours.table, ours_model))  # type: ignore[assignment]
        pair = write_flux_pair(Path(folder), flux_targets(bf16), rank=rank, fmt="peft")
        sides = {
            n: [o.prepare(p, f"r{rank}-{i}") for i, p in enumerate(pair.paths)]
            for n, o in (("fused", fused), ("branch", ours))
        }
        swap = swaps(fused, ours, sides, args.repeats, clock, rank)
        exact = stored_bytes(ours_model) == loaded
        theirs.load_lora_adapter(str(pair.paths[0]), prefix="transformer", adapter_name="a")
        step = _steps(fused, ours, theirs, sides, args, clock, say, inputs, rel)
        exact = exact and stored_bytes(ours_model) == loaded
        fused.reset()
        ours.reset()
    say(f"machine: {_cpu_pressure()}; the whole run took {time.perf_counter() - began:.0f} s")
    say(
        f"quantized: family=flux storage={storage} swap_ms={swap['branch_ms']:.1f} swap_vs_fused={swap['ratio']:.3f} "
        f"step_vs_bf16_fused={step['vs_fused']:.2f} step_vs_diffusers={step['vs_diffusers']:.2f} "
        f"branch_rel_err={step['branch_rel_err']:.4f} vs_diffusers_rel_err={step['diffusers_rel_err']:.5f} "
        f"exact={'true' if exact else 'false'}"
    )
    return {"swap": swap, "step": step, "exact": exact}


def _ours(model: torch.nn.Module) -> Ours:
    return Ours(model, device=torch.device("cpu"), dtype=DTYPE, max_rank=256, cache_bytes=8 * 2**30, family=Family.FLUX)


def _config_folder(model: torch.nn.Module, folder: Path) -> str:
    model.save_config(folder / "config" / "transformer")  # type: ignore[operator]
    return str(folder / "config")


@torch.no_grad()
def _steps(
    fused: Ours, ours: Ours, theirs: Any, sides: dict, args: Any, clock: Clock, say: Any, inputs: Any, rel: Any
) -> dict[str, float]:
    """Eager steps with LoRA "a" on every side, taking turns; the outputs' errors."""
    fused.swap(sides["fused"][0])
    ours.swap(sides["branch"][0])
    given = inputs(args.tokens)
    outputs: dict[str, torch.Tensor] = {}

    def step(name: str, model: torch.nn.Module):  # type: ignore[no-untyped-def]
        return lambda _: outputs.__setitem__(name, model(**given)[0])

    models = {"fused": fused.unet, "ours": ours.unet, "diffusers": theirs}
    samples = round_robin(clock, {name: step(name, model) for name, model in models.items()}, args.repeats)
    out = {
        "fused_ms": statistics.median(samples["fused"]),
        "ours_ms": statistics.median(samples["ours"]),
        "diffusers_ms": statistics.median(samples["diffusers"]),
        "vs_fused": statistics.median(o / f for o, f in zip(samples["ours"], samples["fused"], strict=True)),
        "vs_diffusers": statistics.median(o / d for o, d in zip(samples["ours"], samples["diffusers"], strict=True)),
        "branch_rel_err": rel(outputs["ours"], outputs["fused"]),
        "diffusers_rel_err": rel(outputs["ours"], outputs["diffusers"]),
    }
    say(
        f"step ({args.tokens} image tokens, rank {max(args.ranks)}, branches of {args.max_rank}): GGUF + branch "
        f"{out['ours_ms']:.0f} ms, diffusers GGUF + PEFT {out['diffusers_ms']:.0f} ms, bf16 fused "
        f"{out['fused_ms']:.0f} ms; ours vs diffusers' output {out['diffusers_rel_err']:.5f}, vs bf16 fused "
        f"{out['branch_rel_err']:.4f}"
    )
    return out
