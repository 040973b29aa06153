"""The swap benchmark: changing the served LoRA on the full-size SDXL UNet, five ways, side by side.

    python -m bench.swap [--family sdxl|flux|qwen|wan|krea2|ltx2 [--pair]] [--device cpu|cuda]
                         [--dtype bfloat16|float16|float32] [--ranks 8,32] [--repeats N] [--formats peft,kohya]
                         [--variants loha,lokr,dora] [--quick | --full] [--json PATH] [--plot DIR]
    python -m bench.swap --schedule [--device cpu|cuda] [--steps 8] [--repeats 9]: a LoRA's strength by step
                         (bench.schedule: `boundary_vs_floor=…`, `scheduled_vs_plain=…`)

`--family flux` runs the same sections on a real-width slice of FLUX.1's transformer (`bench.flux_slice`:
2 double and 4 single blocks at width 3072, every layer of each adapted, in kohya's BFL names with fused
qkv/linear1 and in diffusers' names), at ranks 16 and 64, without the LyCORIS section. `--family qwen` runs
them on a real-width slice of Qwen-Image's (`bench.qwen_slice`: 3 blocks at width 3072, every Linear layer of
each adapted, in musubi-tuner's kohya names and in diffusers'), at ranks 16 and 64. `--family wan` on a
real-width slice of Wan's 14B video transformer (`bench.wan_slice`: 2 blocks at width 5120, every Linear layer of
each adapted, in musubi-tuner's names and in diffusers'), at ranks 16 and 64; with `--pair`, Wan 2.2 A14B's two
transformers (two such slices) swapped together against a floor for each (`bench.swap_pair`). `--family krea2`
on a real-width slice of Krea 2's (`bench.krea2_slice`: 2 blocks at width 6144, every Linear layer of each
adapted, in kohya's names with `.alpha` and in diffusers'), at ranks 16 and 64. `--family ltx2` on
a real-width slice of LTX-2 19B's audio-video transformer (`bench.ltx2_slice`: 2 blocks at widths 4096 and 2048,
every Linear layer of each adapted, in the LTX trainer's names and in diffusers'), at ranks 16 and 64.

(a) the reference service: diffusers' load_lora_weights + fuse_lora + unfuse_lora + unload_lora_weights
    per request, a different adapter each time;
(b) diffusers' hotswap (enable_lora_hotswap, then load_lora_weights(..., hotswap=True); unfused);
(c) ours, cached adapter: WeightPatcher.apply through AdapterStore.for_compute, as the engine swaps;
(d) ours, first-seen file: read the header, prepare, keep in the store, apply;
(e) the floor: each touched weight from a pristine copy plus ΔW in float32, rounded once, by the fastest
    of several plain-tensor kernels that reach exactly the engine's weights (measured on this machine); it
    leaves out the factors' float32 cast (made before timing) and the overflow check, which ours pays;
(g) on a GPU only: ours with the pristine copies in pinned host memory (each restore over PCIe), beside (c)
    whose copies are on the device.

(e) and (c) take turns swap by swap, so load from other processes falls on all of them alike. A second
section times LoHa, LoKr and DoRA adapters (ΔW recomputed per swap, as the engine does, and ΔW cached in
float32) against the floor for the same weights (`bench.formats`). The UNet's random weights are cut
from one small pool, so every base tensor can be regenerated and compared bit for bit: after all of our
swaps every tensor must equal its regenerated value (`exact`), and after the reference cycles the
difference is the reference's drift. The default run (ranks 8 and 32, few repeats) takes about 15
minutes on 2 CPU cores; --full is the sweep (ranks 8, 32, 128, more repeats). The last line is
`swap_vs_floor=<c/e> swap_vs_reference=<a/c> exact=<true|false> convert_trace_vs_plain=<t>` at the headline rank
(32 when measured), all formats together: c/e is the median of the swap-by-swap ratios, a/c a ratio of medians;
t the preparation's conversion traced (to find the tensors a converter drops: `bench.convert_trace`) over the
family's converter alone, on each first file of a pair, median of turn-by-turn ratios.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/swap.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gc
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import diffusers
import torch
import transformers

from bench.convert_trace import measure_convert_trace
from bench.flux_slice import build_flux_slice, flux_pool, flux_targets, write_flux_pair
from bench.formats import measure_formats
from bench.krea2_slice import build_krea2_slice, krea2_pool, krea2_targets, write_krea2_pair
from bench.ltx2_slice import build_ltx2_slice, ltx2_pool, ltx2_targets, write_ltx2_pair
from bench.measure import FUSE_FLAGS, Clock, cpu_description
from bench.options import FAMILY_VALUES, Options, parse_options
from bench.ours import LoraPair, write_pair
from bench.qwen_slice import build_qwen_slice, qwen_pool, qwen_targets, write_qwen_pair
from bench.report import Exactness, report
from bench.schedule import main as schedule_main
from bench.sdxl_unet import build_sdxl_unet, drift_from_fill, mismatched_tensors, random_pool
from bench.sections import measure_ours, measure_reference
from bench.swap_pair import run_pair
from bench.wan_slice import build_wan_slice, wan_pool, wan_targets, write_wan_pair
from families import Family
from serving.demo.synthetic import UNET_ATTENTION, find_targets

__all__ = ["main", "run"]

EXPECTED_TARGETS = 560  # to_q/to_k/to_v/to_out.0 of attn1 and attn2 in SDXL's 70 transformer blocks
_MODEL_NAMES = {
    "sdxl": "SDXL UNet",
    "flux": "FLUX.1 transformer slice (2 double + 4 single blocks, width 3072)",
    "qwen": "Qwen-Image transformer slice (3 blocks, width 3072)",
    "wan": "Wan 14B transformer slice (2 blocks, width 5120)",
    "krea2": "Krea 2 transformer slice (2 blocks, width 6144)",
    "ltx2": "LTX-2 19B transformer slice (2 blocks, widths 4096 and 2048)",
}


def _say(text: str) -> None:
    print(text, flush=True)


def _cpu_pressure() -> str:
    """How busy the machine is: other processes slow every method, which the ratios mostly cancel."""
    one, five, _ = os.getloadavg()
    text = f"load average {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} CPUs"
    pressure = Path("/proc/pressure/cpu")
    if pressure.is_file():
        some = pressure.read_text().splitlines()[0]
        avg60 = dict(field.split("=") for field in some.split()[1:]).get("avg60")
        text += f", CPU pressure {avg60}% (60 s)"
    return text


def run(options: Options) -> dict[str, object]:
    device, dtype = options.device, options.dtype
    began = time.perf_counter()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    clock = Clock(device)
    cpu, flags = cpu_description()
    environment = {
        "cpu": cpu,
        "cpu_flags": " ".join(flags),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "before": _cpu_pressure(),
    }
    model_name = _MODEL_NAMES[options.family]
    _say(
        f"swap benchmark: {model_name} with random weights, {options.dtype_name} on {environment['gpu'] or device}; "
        f"torch {torch.__version__}, diffusers {diffusers.__version__}, {torch.get_num_threads()} threads"
    )
    _say(f"CPU: {cpu}; fuse-relevant flags: {' '.join(f for f in FUSE_FLAGS if f in flags) or 'none found'}")
    _say(f"CPU flags: {' '.join(flags) or 'unknown'}")
    _say(f"machine: {environment['before']}")
    started = time.perf_counter()
    pools = {"flux": flux_pool, "qwen": qwen_pool, "wan": wan_pool, "krea2": krea2_pool, "ltx2": ltx2_pool}
    pool = pools.get(options.family, random_pool)()
    slices = {
        "flux": build_flux_slice,
        "qwen": build_qwen_slice,
        "wan": build_wan_slice,
        "krea2": build_krea2_slice,
        "ltx2": build_ltx2_slice,
    }
    build = slices.get(options.family, build_sdxl_unet)
    unet = build(dtype=dtype, device=device, pool=pool)
    parameters = sum(p.numel() for p in unet.parameters())
    _say(f"built the model: {parameters / 1e9:.3f}B parameters in {time.perf_counter() - started:.1f} s")
    write = _TARGETS.get(options.family, _sdxl_targets)(unet)

    with tempfile.TemporaryDirectory(prefix="swap-bench-") as scratch:
        folder = options.workdir or Path(scratch)
        started = time.perf_counter()
        pairs = {(rank, fmt): write(folder, rank, fmt) for rank in options.ranks for fmt in options.formats}
        _say(f"wrote {2 * len(pairs)} LoRA files (float16) in {time.perf_counter() - started:.1f} s")
        ours = measure_ours(unet, pairs, options, clock, _say)
        files = [(f"rank {rank} {fmt} file", pair.paths[0]) for (rank, fmt), pair in pairs.items()]
        family = Family(FAMILY_VALUES[options.family])
        convert_trace = measure_convert_trace(unet, family, files, options.repeats, clock, _say)
        targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION}) if options.variants else []
        formats = measure_formats(unet, targets, folder, options, clock, _say) if options.variants else None
        mismatched = mismatched_tensors(unet, pool)
        _say(f"our swaps are done; {len(mismatched)} tensors differ from the base; {_cpu_pressure()}")
        reference = measure_reference(unet, pairs, options, clock, _say)
    drift, drifted = drift_from_fill(unet, pool)
    environment["after"] = _cpu_pressure()
    environment["wall_s"] = round(time.perf_counter() - began, 1)
    _say(f"machine: {environment['after']}; the whole run took {environment['wall_s']:.0f} s")
    del unet
    gc.collect()
    exactness = Exactness(not mismatched, len(mismatched), drift, drifted, reference.cycles)
    return report(options, environment, ours, reference, exactness, _say, formats, convert_trace)


def _sdxl_targets(unet: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    targets = find_targets({"unet": unet}, {"unet": UNET_ATTENTION})
    if len(targets) != EXPECTED_TARGETS:
        raise SystemExit(f"found {len(targets)} attention projections, expected {EXPECTED_TARGETS}: not SDXL's UNet")
    values = sum(torch.Size(t.weight_shape).numel() for t in targets)
    _say(f"LoRA targets: {len(targets)} attention projections (attn1/attn2 q, k, v, out) holding {values / 1e6:.0f}M")
    return lambda folder, rank, fmt: write_pair(folder, targets, rank=rank, fmt=fmt)


def _flux_targets(transformer: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    layers = flux_targets(transformer)
    modules = dict(transformer.named_modules())
    values = sum(
        modules[part.removeprefix("transformer.")].weight.numel()  # type: ignore[union-attr]
        for layer in layers
        for part in layer.parts
    )
    parts = sum(len(layer.parts) for layer in layers)
    _say(
        f"LoRA targets: {len(layers)} BFL layers (fused qkv and linear1, projections, MLPs, modulations) over "
        f"{parts} diffusers modules holding {values / 1e6:.0f}M"
    )
    return lambda folder, rank, fmt: write_flux_pair(folder, layers, rank=rank, fmt=fmt)


def _qwen_targets(transformer: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    targets = qwen_targets(transformer)
    values = sum(fan_in * fan_out for _, fan_in, fan_out in targets)
    _say(
        f"LoRA targets: {len(targets)} Linear layers (both streams' attention, MLPs and modulations) holding "
        f"{values / 1e6:.0f}M"
    )
    return lambda folder, rank, fmt: write_qwen_pair(folder, targets, rank=rank, fmt=fmt)


def _wan_targets(transformer: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    targets = wan_targets(transformer)
    values = sum(fan_in * fan_out for *_, fan_in, fan_out in targets)
    _say(f"LoRA targets: {len(targets)} Linear layers (attention, feed-forward) holding {values / 1e6:.0f}M")
    return lambda folder, rank, fmt: write_wan_pair(folder, targets, rank=rank, fmt=fmt)


def _krea2_targets(transformer: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    targets = krea2_targets(transformer)
    values = sum(fan_in * fan_out for _, fan_in, fan_out in targets)
    _say(f"LoRA targets: {len(targets)} Linear layers (gated attention, SwiGLU MLP) holding {values / 1e6:.0f}M")
    return lambda folder, rank, fmt: write_krea2_pair(folder, targets, rank=rank, fmt=fmt)


def _ltx2_targets(transformer: torch.nn.Module) -> Callable[[Path, int, str], LoraPair]:
    targets = ltx2_targets(transformer)
    values = sum(fan_in * fan_out for _, fan_in, fan_out in targets)
    _say(
        f"LoRA targets: {len(targets)} Linear layers (video, audio and cross-modal attention, feed-forwards) holding "
        f"{values / 1e6:.0f}M"
    )
    return lambda folder, rank, fmt: write_ltx2_pair(folder, targets, rank=rank, fmt=fmt)


_TARGETS = {
    "flux": _flux_targets,
    "qwen": _qwen_targets,
    "wan": _wan_targets,
    "krea2": _krea2_targets,
    "ltx2": _ltx2_targets,
}


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if "--schedule" in arguments:  # a LoRA's strength by step: its own figures (bench.schedule)
        arguments.remove("--schedule")
        return schedule_main(arguments)
    options = parse_options(arguments, description=(__doc__ or "").split("\n\n")[0])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # diffusers says on every load that the LoRA has no text-encoder part, which is by design here.
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    if options.pair:
        run_pair(options, _say, _cpu_pressure)
    else:
        run(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
