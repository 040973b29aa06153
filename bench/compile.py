"""The compile benchmark: eager against compiled denoisers, through the engine's own swaps, per family.

    python -m bench.compile [--families sdxl,sd15] [--modes default] [--device cpu|cuda] [--swaps 20]
                            [--steps 4] [--repeats 5] [--no-slice] [--tiny] [--json PATH]

Per family, one pipeline, measured side by side in one run: its denoiser's step time (one call on the inputs a
request gives it, eager and compiled taking turns), its image time (a request's inference, median over a run of
swaps; each request runs eager, then compiled, through the engine's one path), the start-up compile's time, and
across the run of swaps (LoRA formats, ranks 2 to 64, scales, sets of several, other layers, pivotal tokens)
dynamo's recompile count and each compiled image's largest difference from the eager image of the same request,
in 8-bit levels. On the CPU (default, or `--tiny` on any device) the pipeline is the family's tiny one, and
a real-width slice of SDXL's denoiser (its middle block at 1024², full width: 1280 channels, 20 heads,
cross-attention 2048; one transformer layer of its ten) has its step time measured the same way, with swaps of
LoRAs on its attention. With `--device cuda` (and no `--tiny`) it is the family's full model (`--model` or the
family's base, from the Hub cache), in float16, at its native size; on cuda `--modes default,reduce-overhead`
(CUDA graphs) is the default.

Each row prints `compile: family=... mode=... recompiles_after_swaps=... max_diff_vs_eager=... step_speedup=...
compile_s=...`; the last line is the same over every row (recompiles summed, the largest difference, the smallest
speed-up, compile seconds summed).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/compile.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from bench.compile_slice import measure_slice
from bench.measure import Clock, cpu_description
from engine.families.registry import family_spec
from engine.pipeline.compiled import dynamo_compiles
from engine.pipeline.loading import LoadedPipeline, load_pipeline, warm_up
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import TINY_MODEL_IDS, Settings
from serving.backends import blocking
from serving.backends.local import LocalBackend
from serving.demo.synthetic import (
    TEXT_ATTENTION,
    UNET_ATTENTION,
    UNET_ATTENTION_FF_CONV,
    KohyaNames,
    find_targets,
    kohya_metadata,
    make_embeddings,
    make_lora,
    peft_metadata,
    save_lora,
)
from serving.demo.synthetic_lycoris import Variant, lycoris_metadata, make_dora, make_loha, make_lokr

Row = dict[str, Any]
# Tiny model id by family name ("sdxl", "sd15"): the families the CPU run measures.
TINY = {str(family_spec(base).family): tiny for tiny, base in TINY_MODEL_IDS.items()}


def _loras(folder: Path, pipe: Any, family: str) -> list[str]:
    """LoRA files of the strength trained ones have (synthetic factors, as `serving.demo.synthetic` makes them): PEFT
    and kohya names, ranks 4 to 64, attention alone or with feed-forward and conv layers or the text encoders, and
    LoHa, LoKr and DoRA; local refs. (The offline demo's LoRAs are far stronger, so their effect shows on a tiny
    random model; that also makes it chaotic, amplifying float rounding into different images, eager or not.)"""
    encoders = [c for c in ("text_encoder", "text_encoder_2") if getattr(pipe, c, None) is not None]
    components = {c: getattr(pipe, c) for c in ("unet", *encoders)}
    attention = find_targets(components, {"unet": UNET_ATTENTION})
    everything = find_targets(components, {"unet": UNET_ATTENTION_FF_CONV} | dict.fromkeys(encoders, TEXT_ATTENTION))
    with_text = find_targets(components, {"unet": UNET_ATTENTION} | dict.fromkeys(encoders, TEXT_ATTENTION))
    names: KohyaNames = "sdxl" if family == "sdxl" else "sd1"
    version = "sdxl_base_v1-0" if family == "sdxl" else "sd_v1"
    files: dict[str, tuple[dict[str, torch.Tensor], dict[str, str]]] = {
        "peft-r4": (make_lora(attention, rank=4, seed=401), peft_metadata(attention, rank=4, alpha=4)),
        "kohya-r8-conv": (
            make_lora(everything, rank=8, seed=402, fmt="kohya", alpha=8, kohya_names=names),
            kohya_metadata(dim=8, alpha=8, base_version=version),
        ),
        "peft-r64-text": (make_lora(with_text, rank=64, seed=403), peft_metadata(with_text, rank=64, alpha=32)),
    }
    lycoris: dict[Variant, tuple[dict[str, torch.Tensor], int]] = {
        "loha": (make_loha(everything, rank=4, seed=404, fmt="peft", alpha=2.0), 4),
        "lokr": (make_lokr(everything, rank=2, seed=405, fmt="peft", alpha=1.0), 2),
        "dora": (make_dora(everything, components, rank=8, seed=406, fmt="peft", alpha=2.0), 8),
    }
    for variant, (tensors, rank) in lycoris.items():
        files[variant] = (tensors, lycoris_metadata(variant, everything, fmt="peft", rank=rank, alpha=2.0))
    for name, (tensors, metadata) in files.items():
        save_lora(folder / f"{name}.safetensors", tensors, metadata)
    return [f"local:{name}.safetensors" for name in files]


def _pivotal(folder: Path, pipe: Any, plain: Path) -> str:
    """A pivotal-tuning pair: a LoRA and its `<name>_emb.safetensors` with new tokens <s0><s1>."""
    encoders = [getattr(pipe, c) for c in ("text_encoder", "text_encoder_2") if getattr(pipe, c, None) is not None]
    weights = [e.get_input_embeddings().weight for e in encoders]
    std = float(torch.stack([w.detach().float().std() for w in weights]).mean()) * 3
    (folder / "tokens.safetensors").write_bytes(plain.read_bytes())
    save_lora(folder / "tokens_emb.safetensors", make_embeddings([w.shape[1] for w in weights], 2, seed=304, std=std))
    return "local:tokens.safetensors"


def _requests(
    refs: Sequence[str], pivotal: str, swaps: int, steps: int, size: tuple[int, int]
) -> list[GenerateRequest]:
    """A run of swaps: each request a set of its own (formats, ranks, scales, sets of several, tokens, the base)."""
    sets: list[tuple[str, tuple[tuple[str, float], ...]]] = [("a fox", ((ref, 1.0),)) for ref in refs]
    sets += [
        ("a photo of <s0><s1>", ((pivotal, 1.0),)),
        ("a fox", ((refs[0], 0.6), (refs[-1], 0.5))),
        ("a fox", ()),
        ("a fox", ((refs[1], -0.7), (refs[2], 0.4), (refs[-2], 0.8))),
    ]
    out = []
    for index in range(swaps):
        prompt, chosen = sets[index % len(sets)]
        factor = 1 - 0.1 * (index // len(sets))
        loras = tuple(LoraSpec(ref, scale=round(scale * factor, 3)) for ref, scale in chosen)
        out.append(GenerateRequest(prompt, loras=loras, steps=steps, seed=7, width=size[0], height=size[1]))
    return out


def _step_inputs(loaded: LoadedPipeline, backend: LocalBackend, request: GenerateRequest) -> tuple[tuple, dict]:
    """The denoiser's first call of `request`, as the pipeline makes it."""
    calls: list[tuple[tuple, dict]] = []
    hook = loaded.denoiser.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append((args, kwargs)) if not calls else None, with_kwargs=True
    )
    try:
        blocking(backend.generate(request))
    finally:
        hook.remove()
    return calls[0]


def _alternate(clock: Clock, calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each call, taking turns (load from other processes falls on all alike)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # untimed: the first call of each settles caches
    for _ in range(repeats):
        for name, call in calls.items():
            started = clock()
            call()
            times[name].append(clock() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def measure_family(name: str, args: argparse.Namespace, workdir: Path) -> list[Row]:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = args.model or (None if cuda and not args.tiny else TINY[name])
    base = args.base or TINY_MODEL_IDS[TINY[name]]
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        model_id=model or base,
        base_model_id=base,
        device=args.device,
        dtype=args.dtype,
        max_rank=64,
        local_lora_dir=folder,
        compile_cache_dir=args.cache_dir,
    )
    loaded = load_pipeline(settings, warm=False)
    size = (loaded.defaults.side, loaded.defaults.side)
    refs = _loras(folder, loaded.pipe, name)
    pivotal = _pivotal(folder, loaded.pipe, folder / "peft-r4.safetensors")
    requests = _requests(refs, pivotal, args.swaps, args.steps, size)
    resolver = AdapterResolver(None, local_dir=folder, token=None, max_bytes=settings.max_adapter_bytes)
    engine = Engine(loaded, settings, resolver)
    backend = LocalBackend.of(engine)
    clock = Clock(device)
    rows = []
    for mode in args.modes:
        compiled = warm_up(loaded, settings.replace(compile=mode), sizes=[size]).compiled
        assert compiled is not None
        inputs = _step_inputs(loaded, backend, requests[0])
        compiles = dynamo_compiles()
        eager_s, compiled_s, diff = _paired(backend, loaded.denoiser, compiled, requests)
        recompiles = dynamo_compiles() - compiles + compiled.recompiles
        with torch.inference_mode():
            step = _alternate(clock, _calls(compiled, *inputs), args.repeats)
        rows.append(
            {
                "family": name,
                "model": settings.model_id,
                "mode": mode,
                "size": list(size),
                "steps": args.steps,
                "swaps": len(requests),
                "eager_step_s": step["eager"],
                "compiled_step_s": step["compiled"],
                "step_speedup": step["eager"] / step["compiled"],
                "eager_image_s": statistics.median(eager_s),
                "compiled_image_s": statistics.median(compiled_s),
                "image_speedup": statistics.median(eager_s) / statistics.median(compiled_s),
                "compile_s": compiled.compile_s,
                "recompiles_after_swaps": recompiles,
                "eager_calls": compiled.eager_calls,
                "max_diff_vs_eager": diff,
            }
        )
        _say(rows[-1])
        compiled.remove()
    engine.close()
    return rows


def _calls(compiled: Any, args: tuple, kwargs: dict) -> dict[str, Callable[[], object]]:
    return {"eager": lambda: compiled.eager(*args, **kwargs), "compiled": lambda: compiled(*args, **kwargs)}


def _paired(
    backend: LocalBackend, denoiser: Any, compiled: Any, requests: Sequence[GenerateRequest]
) -> tuple[list[float], list[float], int]:
    """Each request through the one path twice, eager then compiled, taking turns (load from other processes falls
    on both alike): the first run swaps to its set, the second finds it fused. Inference seconds of each, and the
    largest difference between the two images of a request, in 8-bit levels."""
    eager_s, compiled_s, diff = [], [], 0
    for request in requests:
        results = []
        for forward in (compiled.eager, compiled):
            denoiser.forward = forward  # the module's own forward, or the compiled one
            results.append(blocking(backend.generate(request)))
        eager, done = (np.asarray(r.image, dtype=np.int16) for r in results)
        diff = max(diff, int(np.abs(eager - done).max()))
        eager_s.append(results[0].timings.inference)
        compiled_s.append(results[1].timings.inference)
    return eager_s, compiled_s, diff


def _say(row: Row) -> None:
    print(
        f"  {row['family']:>10} {row['mode']:>15}  step {row['eager_step_s'] * 1000:9.1f} -> "
        f"{row['compiled_step_s'] * 1000:9.1f} ms (x{row['step_speedup']:.2f})  "
        + (
            f"image {row['eager_image_s']:7.2f} -> {row['compiled_image_s']:7.2f} s (x{row['image_speedup']:.2f})  "
            if "eager_image_s" in row
            else ""
        )
        + f"compile {row['compile_s']:6.1f} s  swaps {row['swaps']}  recompiles {row['recompiles_after_swaps']}"
        + f"  max diff {row['max_diff_vs_eager']:.3g}",
        flush=True,
    )
    print(_line([row]), flush=True)


def _line(rows: Sequence[Row]) -> str:
    return (
        f"compile: family={','.join(dict.fromkeys(r['family'] for r in rows))} "
        f"mode={','.join(dict.fromkeys(r['mode'] for r in rows))} "
        f"recompiles_after_swaps={sum(r['recompiles_after_swaps'] for r in rows)} "
        f"max_diff_vs_eager={max(r['max_diff_vs_eager'] for r in rows):.3g} "
        f"step_speedup={min(r['step_speedup'] for r in rows):.2f} "
        f"compile_s={sum(r['compile_s'] for r in rows):.1f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(TINY), help=f"comma-separated: {', '.join(TINY)}")
    parser.add_argument(
        "--modes", default=None, help="COMPILE modes (default: default; on cuda default,reduce-overhead)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default float32 on the CPU, float16 on cuda")
    parser.add_argument("--model", default=None, help="cuda: a Hub id or folder of the family's full model")
    parser.add_argument("--base", default=None, help="with --model: its base repo id (default: the family's)")
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=None, help="default 4 on the CPU, 20 on cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-slice", action="store_true", help="skip the real-width slice (CPU, or --tiny)")
    parser.add_argument(
        "--tiny", action="store_true", help="cuda: the tiny pipelines and the slice, as on the CPU (no Hub needed)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="inductor's cache folder (COMPILE_CACHE_DIR)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.modes = [m for m in (args.modes or ("default,reduce-overhead" if cuda else "default")).split(",") if m]
    args.dtype = args.dtype or ("float16" if cuda else "float32")
    args.steps = args.steps or (20 if cuda else 4)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in TINY and not args.model]
    if unknown:
        parser.error(f"unknown famil(ies) {', '.join(unknown)}; accepted: {', '.join(TINY)}")
    cpu, _ = cpu_description()
    print(
        f"compile benchmark: {args.device} ({cpu}), {args.dtype}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}; modes {', '.join(args.modes)}; {args.swaps} swaps of {args.steps} steps",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as workdir:
        for family in families:
            rows.extend(measure_family(family, args, Path(workdir)))
        if (args.tiny or not cuda) and not args.no_slice:
            device, dtype = torch.device(args.device), getattr(torch, args.dtype)
            row = measure_slice(args.modes[0], args.repeats, args.swaps, Path(workdir), device, dtype)
            rows.append(row)
            _say(row)
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu, "torch": torch.__version__, "rows": rows}, indent=2))
    print(_line(rows))
    ok = all(r["recompiles_after_swaps"] == 0 and r["max_diff_vs_eager"] <= 2 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
