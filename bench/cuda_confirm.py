"""What the CUDA-only fixes of issue 29 (section 4) should show on a GPU, one measurement and one line each.

    python -m bench.cuda_confirm residency|host_pinned|vae_decode|rerecord|wan_video [--tiny] [--moves 20]

- `residency` (defect 1): the full-size SDXL UNet (fp16) built on `cuda:0`, then `Residency.add` on the
  setting's device `cuda` (no index). It must not move it in again: `moves_on_add=0`, and the allocator's extra
  bytes over the add against the weights ~0 (1.00 was the second copy). Then a second pool that does not fit
  beside it takes its turn and the first comes back: both moves timed, one flat copy each.
  `residency: moves_on_add= extra_on_add_vs_weights= move_in_s= gib_per_s=`
- `host_pinned` (defect 4): after `engine.hostmem.configure_pinned`, the UNet moved to pinned host memory
  (`FlatWeights.to_host`): `torch.cuda.host_memory_stats()`'s allocated bytes against the buffer's, 1.00 when
  pinned at its size (torch's default rounds 4.8 GiB up to 8).
  `host_pinned: nbytes_gib= pinned_gib= pinned_vs_nbytes=`
- `vae_decode` (defects 2 and 5): the allocator's peak reserved bytes over an SDXL UNet step (batch 2, 1024²) and
  over the SDXL VAE's decode in float32 (the pool keeps it so), each above the weights, against what the plan
  reserves for the family beside its weights (`MemorySpec.working_bytes`).
  `vae_decode: step_extra_gib= decode_extra_gib= working_gib= fits=<true|false>`
- `rerecord` (defect 8): a UNet compiled `reduce-overhead` as a resident pool is (CUDA graphs) and as a pool that
  takes turns is (`cudagraphs=False`), each moved out and back `--moves` times with a step after every move:
  the first step after the last move over the first step after the first (graphs kept per move made every call
  scan them all and re-record), and the steady step.
  `rerecord: moves= graphs_growth= graphs_after_move_ms= nographs_growth= nographs_after_move_ms= steady_ms=`

- `wan_video` (issue 42): the allocator's peak reserved bytes over one block of Wan's 14B transformer at real width
  (bf16, one CFG branch, as diffusers' call runs them) and over Wan 2.1's VAE decode (bf16), each at 81 frames at
  480p (832x480) and 720p (1280x720), against the plan's formulas (`engine.families.wan_memory`: `step_bytes`,
  `decode_bytes`) and the 14B base's `working_bytes` (planned at 720p). One line per size:
  `wan_video: size= tokens= step_extra_gib= step_planned_gib= decode_extra_gib= decode_planned_gib= fits=`

`--tiny` takes the tiny pipeline's configs: a smoke run, and on the CPU `residency` and `vae_decode` run without
the allocator's figures (printed `na`); `host_pinned` and `rerecord` need CUDA. Run by `bench/gpu_check.sh`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/cuda_confirm.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from diffusers import AutoencoderKL

from bench.sdxl_unet import build_filled, build_sdxl_unet
from bench.unet_step import step_inputs
from engine.families.registry import spec_for
from engine.hostmem import configure_pinned
from engine.pipeline.compiled import compile_denoiser
from engine.pools.flat import FlatWeights, module_bytes
from engine.pools.residency import Residency
from families import Family

__all__ = ["main"]

_GIB = 2**30
# SDXL's VAE (stabilityai/stable-diffusion-xl-base-1.0, vae/config.json): built with random weights, no download.
SDXL_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _unet(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    config = None
    if args.tiny:
        from engine.families.sdxl import build_tiny_pipeline

        config = dict(build_tiny_pipeline().unet.config)
    from bench.sdxl_unet import random_pool

    return build_sdxl_unet(dtype=dtype, device=device, config=config, pool=random_pool(seed))


def residency(args: argparse.Namespace, device: torch.device) -> str:
    """Defect 1: a pool already on the GPU is registered without a second copy; then one move each way."""
    cuda = device.type == "cuda"
    setting = torch.device("cuda") if cuda else device  # what `resolve_device` returns: no index
    first = _unet(args, device, torch.float16 if cuda else torch.float32)
    weights = module_bytes([first])
    res = Residency(setting, budget=int(weights * 1.5))
    _sync(device)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    res.add("first", [first], before_leaving=lambda: None)
    _sync(device)
    extra = (torch.cuda.max_memory_allocated(device) - before) / weights if cuda else float("nan")
    moves_on_add = {m.name: m.moves_in for m in res.snapshot()}["first"]
    second = _unet(args, torch.device("cpu"), first.dtype, seed=1)
    res.add("second", [second], before_leaving=lambda: None)
    with res.use("second") as moved_second:
        pass
    with res.use("first") as moved_first:
        pass
    move_s = statistics.median([moved_second, moved_first])
    return (
        f"residency: moves_on_add={moves_on_add} extra_on_add_vs_weights={_fmt(extra)} move_in_s={move_s:.3f} "
        f"gib_per_s={weights / _GIB / move_s if move_s else float('nan'):.1f} weights_gib={weights / _GIB:.2f}"
    )


def host_pinned(args: argparse.Namespace, device: torch.device) -> str:
    """Defect 4: the flat host buffer pins its own size, not the next power of two."""
    configure_pinned()
    unet = _unet(args, device, torch.float16)
    flat = FlatWeights([unet], pin=True)
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    flat.to_host()
    pinned = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) - before
    size = flat.host_buffer.nbytes
    return (
        f"host_pinned: nbytes_gib={size / _GIB:.2f} pinned_gib={pinned / _GIB:.2f} pinned_vs_nbytes={pinned / size:.2f}"
    )


def _peak_extra(device: torch.device, call: Callable[[], object]) -> float:
    """GiB the allocator reserved over `call` beyond what it held before (na off CUDA)."""
    if device.type != "cuda":
        return float("nan")
    _sync(device)
    before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    _sync(device)
    return (torch.cuda.max_memory_reserved(device) - before) / _GIB


def vae_decode(args: argparse.Namespace, device: torch.device) -> str:
    """Defects 2 and 5: a step's and a float32 VAE decode's working memory against the plan's reserve."""
    cuda = device.type == "cuda"
    unet = _unet(args, device, torch.float16 if cuda else torch.float32)
    side = 128 if args.tiny else 1024
    inputs = step_inputs(dict(unet.config), side, device, unet.dtype)
    config = SDXL_VAE_CONFIG
    if args.tiny:
        from engine.families.sdxl import build_tiny_pipeline

        config = dict(build_tiny_pipeline().vae.config)
    from bench.sdxl_unet import random_pool

    vae = build_filled(AutoencoderKL, config, dtype=torch.float32, device=device, pool=random_pool(2))
    latents = torch.randn(1, config["latent_channels"], side // 8, side // 8, device=device)
    with torch.inference_mode():
        step = _peak_extra(device, lambda: unet(**inputs))
        decode = _peak_extra(device, lambda: vae.decode(latents))
    working = spec_for(Family.SDXL).memory.working_bytes / _GIB
    fits = "na" if not cuda else str(max(step, decode) <= working).lower()
    return (
        f"vae_decode: side={side} step_extra_gib={_fmt(step)} decode_extra_gib={_fmt(decode)} "
        f"working_gib={working:.2f} fits={fits}"
    )


def wan_video(args: argparse.Namespace, device: torch.device) -> str:
    """Issue 42: a Wan step's and its VAE decode's working memory against the plan's formulas."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from engine.families.registry import family_spec
    from engine.families.wan_memory import SIZE_480P, SIZE_720P
    from families.wan import MODEL_ID_14B

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.tiny:
        from engine.families.tiny_wan import build_tiny_pipeline

        pipe = build_tiny_pipeline()
        transformer, vae, sizes = pipe.transformer, pipe.vae, ((5, 64, 48),)
    else:
        with torch.device(device):
            # One block at the 14B's real width: a step's peak is one block's (the blocks run one at a time).
            transformer, vae = WanTransformer3DModel(num_layers=1), AutoencoderKLWan()
        sizes = (SIZE_480P, SIZE_720P)
    transformer, vae = transformer.to(device, dtype).eval(), vae.to(device, dtype).eval()
    working = family_spec(MODEL_ID_14B, setting="BASE_MODEL_ID").memory_of(MODEL_ID_14B).working_bytes
    return "\n".join(_wan_size(transformer, vae, size, device, working) for size in sizes)


def _wan_size(transformer: Any, vae: Any, size: tuple[int, int, int], device: torch.device, working: int) -> str:
    from engine.families import wan_memory

    frames, width, height = size
    shape = wan_memory.SHAPE_14B
    latent = (1, int(transformer.config.in_channels), (frames - 1) // 4 + 1, height // 8, width // 8)
    latents = torch.randn(latent, device=device, dtype=transformer.dtype)
    text = torch.randn(1, 512, int(transformer.config.text_dim), device=device, dtype=transformer.dtype)
    timestep = torch.tensor([500], device=device)
    with torch.inference_mode():
        step = _peak_extra(device, lambda: transformer(latents, timestep, text, return_dict=False))
        decode = _peak_extra(device, lambda: vae.decode(latents[:, : vae.config.z_dim]))
    fits = "na" if device.type != "cuda" else str(max(step, decode) <= working / _GIB).lower()
    return (
        f"wan_video: size={frames}x{width}x{height} tokens={wan_memory.video_tokens(shape, frames, width, height)} "
        f"step_extra_gib={_fmt(step)} step_planned_gib={wan_memory.step_bytes(shape, *size) / _GIB:.2f} "
        f"decode_extra_gib={_fmt(decode)} decode_planned_gib={wan_memory.decode_bytes(shape, *size) / _GIB:.2f} "
        f"working_gib={working / _GIB:.2f} fits={fits}"
    )


def _after_moves(unet: Any, inputs: dict[str, Any], device: torch.device, moves: int, graphs: bool) -> list[float]:
    """Compile, then `moves` times: move the pool out and in, time the first step after the move."""
    compiled = compile_denoiser(unet, "reduce-overhead", [(0, 0)], lambda _w, _h: unet(**inputs), cudagraphs=graphs)
    flat = FlatWeights([unet], pin=True)
    times = []
    try:
        for _ in range(moves):
            flat.to_host()
            flat.to_device(device)
            _sync(device)
            started = time.perf_counter()
            compiled(**inputs)
            _sync(device)
            times.append(time.perf_counter() - started)
    finally:
        compiled.remove()
    return times


def rerecord(args: argparse.Namespace, device: torch.device) -> str:
    """Defect 8: what moving a compiled pool costs its next step, with CUDA graphs and without."""
    unet = _unet(args, device, torch.float16)
    inputs = step_inputs(dict(unet.config), 128 if args.tiny else 1024, device, unet.dtype)
    with torch.inference_mode():
        graphs = _after_moves(unet, inputs, device, args.moves, graphs=True)
        plain = _after_moves(unet, inputs, device, args.moves, graphs=False)
        _sync(device)
        started = time.perf_counter()
        unet(**inputs)
        _sync(device)
        steady = time.perf_counter() - started
    return (
        f"rerecord: moves={args.moves} graphs_growth={graphs[-1] / graphs[0]:.2f} "
        f"graphs_after_move_ms={graphs[-1] * 1000:.1f} nographs_growth={plain[-1] / plain[0]:.2f} "
        f"nographs_after_move_ms={plain[-1] * 1000:.1f} steady_ms={steady * 1000:.1f}"
    )


def _fmt(value: float) -> str:
    return "na" if value != value else f"{value:.2f}"


_MEASURES: dict[str, tuple[Callable[[argparse.Namespace, torch.device], str], bool]] = {
    # name: (measure, needs CUDA even with --tiny)
    "residency": (residency, False),
    "host_pinned": (host_pinned, True),
    "vae_decode": (vae_decode, False),
    "rerecord": (rerecord, True),
    "wan_video": (wan_video, False),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cuda_confirm", description=__doc__.splitlines()[0])
    parser.add_argument("measure", choices=sorted(_MEASURES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny pipeline's configs (a smoke run)")
    parser.add_argument("--moves", type=int, default=20, help="rerecord: pool moves (default 20)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    measure, needs_cuda = _MEASURES[args.measure]
    if device.type != "cuda" and (needs_cuda or not args.tiny):
        tiny = "residency, vae_decode, wan_video"
        parser.error(f"{args.measure} on {device}; accepted: a CUDA device (or --tiny for {tiny})")
    if args.moves < 2:
        parser.error(f"--moves {args.moves}; accepted: 2 or more")
    print(f"cuda_confirm {args.measure}: {'tiny' if args.tiny else 'full-size'} SDXL on {device}", flush=True)
    print(measure(args, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
