"""`bench.mixed`'s stand-in replay as the fleet model sees it: the same arrivals on `bench.fleet_device.SimDevice`
(simpy, the engine's policy and settings), so that the model of a replica's GPU shared by an image pool and a video
pool is checked against the engine's real `DeviceScheduler` on real threads (`sim_gap`, printed by `bench.mixed`).

Each pool runs one request at a time in arrival order (the replay's FIFO), each run its pieces from the same cost
table (its decode pieces timed apart, as the stand-in's and the engine's); the first guess of a pool's piece time is
the real scheduler's (`FIRST_GUESS_S` real seconds, so that many over `scale` on the A10G's clock). `sim_gap` for a
kind is |model p95 / measured p95 - 1|, the measured p95 taken on the A10G's scale (real seconds over `scale`), both
by `bench.mixed_model.p95`.
"""

from __future__ import annotations

import statistics
from collections.abc import Generator, Sequence

import simpy

from bench.fleet_device import SimDevice
from bench.mixed_model import Arrival, p95
from engine.events import RunShare
from engine.pipeline.sharing import Sharing
from engine.pipeline.stepshare import FIRST_GUESS_S

__all__ = ["measured_cost", "model_p95s", "sim_gap"]

Cost = tuple[int, float, int, float]  # denoising pieces, seconds each, decode pieces, seconds each


def model_p95s(
    plan: tuple[Arrival, ...],
    mode: Sharing,
    starve: float,
    scale: float,
    image: Cost,
    video: Cost,
    video_step_pieces: int = 1,
) -> tuple[float, float]:
    """The model's image and video p95 latencies (A10G seconds) for `plan` with the device shared as `mode` says, a
    video's step `video_step_pieces` of its pieces (the starvation bound's unit)."""
    env = simpy.Environment()
    device = SimDevice(env, mode, starve, first_guess_s=FIRST_GUESS_S / scale)
    pools = {False: simpy.Resource(env, capacity=1), True: simpy.Resource(env, capacity=1)}
    latencies: dict[bool, list[float]] = {False: [], True: []}

    def one(arrival: Arrival) -> Generator[simpy.Event, object, None]:
        yield env.timeout(arrival.at_s)
        steps, step_s, chunks, chunk_s = video if arrival.video else image
        with pools[arrival.video].request() as held:
            yield held
            pieces = [step_s] * steps + [chunk_s] * chunks
            step_pieces = video_step_pieces if arrival.video else 1
            pool = "wan" if arrival.video else "sdxl"
            yield from device.run(pool, pieces, video=arrival.video, step_pieces=step_pieces, chunks=chunks)
        latencies[arrival.video].append(env.now - arrival.at_s)

    for arrival in plan:
        env.process(one(arrival))
    env.run()
    return p95(latencies[False]), p95(latencies[True])


def measured_cost(shares: Sequence[RunShare], table: Cost, scale: float, video: bool) -> Cost:
    """`table`'s cost as a replay's device held it (A10G seconds): each piece stretched by the mean ratio of a run's
    device time to its table time, over the runs of its kind (`video` or not)."""
    steps, step_s, chunks, chunk_s = table
    alone_s = (steps * step_s + chunks * chunk_s) * scale
    ratios = [s.device_s / alone_s for s in shares if s.video == video]
    stretch = statistics.fmean(ratios) if ratios else 1.0
    return steps, step_s * stretch, chunks, chunk_s * stretch


def sim_gap(model_s: float, measured_s: float) -> float:
    """|model / measured - 1|: the model's relative error on a p95."""
    return abs(model_s / measured_s - 1) if measured_s > 0 else float("nan")
