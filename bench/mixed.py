"""`python -m bench.mixed`: one GPU shared by an image pool and a video pool, the whole-run lock against step
sharing (issue 48), on the same arrivals.

Two devices:
- a stand-in A10G, where each step holds the device (the real `DeviceScheduler`, real threads) for its time from
  the cost table below, scaled down by `--scale` (time is reported on the A10G's scale);
- this CPU, with the tiny SDXL and Wan pipelines served by the real engine with `DEVICE_SHARING=step` or `run`
  (`bench.mixed_cpu`), which also checks that every result equals its request's solo run (`exact`); with
  `--device cuda` the same engine replay runs on the GPU, its lines named `cuda_…` (`bench/gpu_check.sh`'s `mixed`).

Traffic: images at random at `--image-load` of the device's image capacity, and a video every
`video × --video-every` (its own device time times that factor). The default image load is 0.2, not the issue's
example of 0.5: at 0.5 no policy can hold both targets (the video, sharing the device with images at half of it,
gets half of it while it runs: about twice its own time, against 1.25; giving it 80 % would leave images a
backlog of 0.3 × its 8 minutes), and `--image-load 0.5` shows it.

The cost table (A10G, one request at a time, fp16), each figure with its source; claims are the publishers':
- SDXL 1024², 30 steps: 9.399 s, the PyTorch baseline on an A10 in stabilityai/stable-diffusion-xl-1.0-tensorrt's
  model card (claim; the A10G is taken as the A10), so 0.313 s a step with the text encoders and the VAE decode
  folded in; the decode is a piece of its own after the last step's boundary, as the engine's image run makes it
  (`engine.pipeline.inference.decode_pieces`), here of no time (the source times the run whole).
- Wan 2.1 T2V 1.3B, 480p (832×480), 81 frames, 50 steps: "about 4 minutes" on an RTX 4090 in Wan's README
  (claim), times 2.0 for an A10G (our estimate: the A10's 125 dense FP16 tensor TFLOPS and 600 GB/s against the
  4090's 165 and 1,008 GB/s), so 480 s: 50 steps of 9.2 s, and the VAE decode's 21 latent frames at 1.0 s each
  (estimate; each a piece of its own, timed apart from the blocks as the engine times a run's decode chunks:
  `stepshare.left_s`). A step's pieces are as the engine makes them (`engine.pipeline.inference.
  run_pieces`): its two guidance passes, each through the 1.3B transformer's 30 blocks, a boundary before each
  block: 3,000 pieces of 9.2 / 60 = 0.153 s. The even split is our estimate: both passes run the same tokens
  through the same transformer (only the text embeddings differ), and its 30 blocks are alike (the patch
  embedding before them and the head after them are small beside a block and fall into the first and last).

The stand-in's waits keep its device's time honest: a real wait overshoots its time by a wake-up's latency (more
on a loaded CPU), which over a video's 3,000 pieces would add minutes of device time the table does not hold.
A run's pieces end on a schedule of their own instead: each piece ends at the previous one's scheduled end plus
its table time, so a late wake-up shortens the next piece; only a run that was paused at a boundary starts its
next piece from when it got the device back.

The fleet model's replica GPU (`bench.fleet_device`, issue 48 item 4) replays the stand-in's arrivals too
(`bench.mixed_sim`): a `model_<mode>` line per mode with its image and video p95 beside the stand-in's, and `sim_gap`,
the largest |model / measured - 1| of the four p95s (target ≤ 0.05).

Prints a line per device and, last, the one line: the stand-in's figures with sharing, `exact` from the CPU's
run, the whole-run lock's image_p95_vs_alone beside them, and the model's `sim_gap`.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.pipeline.stepshare import DeviceScheduler, DeviceTurn
from engine.settings import Settings

from .mixed_model import Arrival, Figures, Recorded, arrivals, figures, replay

# (denoiser pieces, seconds each, decode pieces, seconds each) on the stand-in A10G: sources above. An SDXL step is
# one piece (its guidance batched into one forward), its decode one of no time; a Wan step 60 (its two guidance
# passes, one after the other, each through its transformer's 30 blocks).
SDXL_A10G = (30, 9.399 / 30, 1, 0.0)
WAN_STEP_S, WAN_PASSES, WAN_BLOCKS = 9.2, 2, 30
WAN_STEP_PIECES = WAN_PASSES * WAN_BLOCKS
WAN_A10G = (50 * WAN_STEP_PIECES, WAN_STEP_S / WAN_STEP_PIECES, 21, 1.0)
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Options:
    scale: float
    hours: float
    image_load: float
    video_every: float
    starve: float
    cpu_videos: int
    seed: int
    # Where the engine replay's tiny pools run (`bench.mixed_cpu`): "cpu" or "cuda"; the stand-in is the same.
    device: str = "cpu"


class _Fifo:
    """A pool's own queue: one run at a time, in arrival order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            mine, self._next = self._next, self._next + 1
            self._cond.wait_for(lambda: self._serving == mine)

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


def _alone_s(cost: tuple[int, float, int, float]) -> float:
    steps, step_s, chunks, chunk_s = cost
    return steps * step_s + chunks * chunk_s


def plan_of(options: Options) -> tuple[Arrival, ...]:
    """The arrivals every replay of `options` shares (A10G seconds)."""
    return arrivals(
        duration_s=options.hours * 3600,
        image_s=_alone_s(SDXL_A10G),
        image_load=options.image_load,
        video_every_s=_alone_s(WAN_A10G) * options.video_every,
        seed=options.seed,
    )


def stand_in(options: Options, mode: str) -> tuple[Figures, float, Recorded]:
    """One replay on the stand-in A10G: its figures (on the A10G's scale), the whole replay's video p95, and its
    scheduler's record."""
    plan = plan_of(options)
    scheduler = Recorded()
    pools = {False: _Fifo(), True: _Fifo()}

    def run(arrival: Arrival) -> None:
        with pools[arrival.video]:
            stand_in_run(scheduler, arrival.video, options, mode)

    result = replay(plan, options.scale, run, scheduler)
    found = figures(result, _alone_s(SDXL_A10G) * options.scale, WAN_STEP_S * options.scale)
    return found, found.video_p95 / options.scale, scheduler


def stand_in_run(
    scheduler: DeviceScheduler,
    video: bool,
    options: Options,
    mode: str,
    clock: Callable[[], float] = time.perf_counter,
    wait: Callable[[float], object] | None = None,
) -> None:
    """One run of the table's image or video on the stand-in A10G's `scheduler`, its turn taken as the engine's
    (`engine.pipeline.sharing.pool_turn`: its pieces, a step's, and its last `chunks` a decode's, timed apart)."""
    steps, step_s, chunks, chunk_s = WAN_A10G if video else SDXL_A10G
    costs = [step_s] * steps + [chunk_s] * chunks
    with scheduler.turn(
        "wan" if video else "sdxl",
        len(costs),
        video=video,
        starve=options.starve,
        step_pieces=WAN_STEP_PIECES if video else 1,
        step=mode == "step",
        chunks=chunks,
    ) as turn:
        held(turn, [cost * options.scale for cost in costs], clock, wait)


def held(
    turn: DeviceTurn,
    pieces: list[float],
    clock: Callable[[], float] = time.perf_counter,
    wait: Callable[[float], object] | None = None,
) -> None:
    """Hold the device for `pieces` real seconds one after the other, a boundary between each two: each piece ends
    on its schedule (the previous piece's scheduled end plus its time), so a wake-up's overshoot is taken from the
    next piece rather than added to the run; after a pause the schedule starts again when the run holds the device
    (module docstring). (The stand-in's device is a wait: a bench may sleep.)"""
    wait = threading.Event().wait if wait is None else wait
    pauses, start = turn.pauses, clock()
    for done, piece in enumerate(pieces, start=1):
        end = start + piece
        if (left := end - clock()) > 0:
            wait(left)
        turn.boundary(len(pieces) - done)
        if turn.pauses != pauses:
            pauses, start = turn.pauses, clock()
        else:
            start = end


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mixed", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--scale", type=float, default=0.02, help="real seconds per stand-in A10G second (default 0.02)")
    add("--hours", type=float, default=2.0, help="stand-in A10G hours of traffic per mode (default 2)")
    add("--image-load", type=float, default=0.2, help="images as a share of the device's image capacity")
    add("--video-every", type=float, default=2.0, help="a video every this many times its own device time")
    starve = Settings().step_sharing_starve_steps
    add("--starve", type=float, default=starve, help=f"STEP_SHARING_STARVE_STEPS (default: the setting's, {starve:g})")
    add("--cpu-videos", type=int, default=6, help="videos per mode in the CPU's replay (default 6; 0: skip it)")
    add("--seed", type=int, default=0)
    add("--device", choices=DEVICES, default="cpu", help="where the engine replay's tiny pools run (default cpu)")
    add("--quick", action="store_true", help="a short run (15 stand-in minutes at scale 0.005, 2 CPU videos)")
    args = parser.parse_args(argv)
    _check_device(parser, args.device)
    options = Options(
        0.005 if args.quick else args.scale,
        0.25 if args.quick else args.hours,
        args.image_load,
        args.video_every,
        args.starve,
        min(2, args.cpu_videos) if args.quick else args.cpu_videos,
        args.seed,
        args.device,
    )
    whole, whole_video, whole_record = stand_in(options, "run")
    shared, shared_video, shared_record = stand_in(options, "step")
    print(_line("a10g_whole_run", whole, 1.0), flush=True)
    print(_line("a10g_step", shared, shared_video / whole_video), flush=True)
    measured = {"run": (whole, whole_video, whole_record), "step": (shared, shared_video, shared_record)}
    gap = _model_gap(options, measured)
    exact = "n/a"
    if options.cpu_videos:
        from .mixed_cpu import cpu_replays

        cpu_whole, cpu_shared, same = cpu_replays(options)
        print(_line(f"{options.device}_whole_run", cpu_whole, 1.0), flush=True)
        print(_line(f"{options.device}_step", cpu_shared, cpu_shared.video_p95 / cpu_whole.video_p95), flush=True)
        exact = "true" if same else "false"
    print(
        f"mixed: image_p95_vs_alone={shared.image_p95_vs_alone:.2f} "
        f"image_wait_max_vs_video_step={shared.image_wait_max_vs_video_step:.2f} "
        f"video_p95_vs_whole_run={shared_video / whole_video:.2f} device_busy={shared.device_busy:.2f} "
        f"exact={exact} whole_run_image_p95_vs_alone={whole.image_p95_vs_alone:.2f} "
        f"sim_gap={'n/a' if gap is None else f'{gap:.3f}'}"
    )


def _check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """Refuse `--device cuda` where torch sees no CUDA device, before any replay runs (argparse's exit 2)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA device here (torch {torch.__version__}); accepted: {', '.join(DEVICES)}")


def _model_gap(options: Options, measured: dict[str, tuple[Figures, float, Recorded]]) -> float | None:
    """The fleet model's replica GPU on the same arrivals, a line per mode; the largest relative p95 gap. The
    model's piece times are those the replay's device measured (as `bench.fleet --real` calibrates the model on
    the cluster): a stand-in wait overshoots its time by what the loaded CPU adds to each wake-up. None, said in a
    line, where simpy is not installed."""
    from engine.pipeline.sharing import Sharing

    try:
        from .mixed_sim import measured_cost, model_p95s, sim_gap
    except ImportError as e:  # simpy is a dev tool: gpu_check.sh's venv does not carry it (the model is no GPU's)
        print(f"model: skipped ({e})", flush=True)
        return None

    plan, gaps = plan_of(options), []
    for mode, (found, video_s, record) in measured.items():
        image_s = found.image_p95_vs_alone * _alone_s(SDXL_A10G)
        sharing: Sharing = "step" if mode == "step" else "run"
        image = measured_cost(record.shares, SDXL_A10G, options.scale, video=False)
        video = measured_cost(record.shares, WAN_A10G, options.scale, video=True)
        model = model_p95s(plan, sharing, options.starve, options.scale, image, video, WAN_STEP_PIECES)
        mine = (sim_gap(model[0], image_s), sim_gap(model[1], video_s))
        gaps.extend(mine)
        print(
            f"model_{mode}: image_p95={model[0]:.1f} s (stand-in {image_s:.1f} s) video_p95={model[1]:.1f} s "
            f"(stand-in {video_s:.1f} s) sim_gap_image={mine[0]:.3f} sim_gap_video={mine[1]:.3f}",
            flush=True,
        )
    return max(gaps)


def _line(name: str, found: Figures, video_ratio: float) -> str:
    return (
        f"{name}: image_p95_vs_alone={found.image_p95_vs_alone:.2f} "
        f"image_wait_max_vs_video_step={found.image_wait_max_vs_video_step:.2f} "
        f"video_p95_vs_whole_run={video_ratio:.2f} device_busy={found.device_busy:.2f}"
    )


if __name__ == "__main__":
    main()
