"""The stand-in GPU of `bench.fleet --real` (serving/cluster/standin.py): its wait holds no core, and a replica's
engine runs no second image while one waits; it waits a step at a time with the step callback after each, so with
step sharing an image behind a video goes at the video's next step (the whole video with the whole-run lock); a
tiny Wan video waits a piece at a time (a block of a guidance pass, a decode chunk), the engine's boundary through
the device's scheduler between each two."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine.pipeline.inference import run_pieces
from engine.pipeline.sharing import scheduler_for
from engine.pipeline.stepshare import DeviceScheduler
from engine.requests import GenerateRequest
from serving.cluster.standin import VideoWaits, install_standin_gpu
from tests.support.checks import generate
from tests.support.stepshare import WAIT_S, started, until

_WAIT_S = 0.4


@pytest.fixture
def own_loaded(base_settings):
    """A pipeline of this test's own: the stand-in changes its class, which the session's shared one must keep."""
    from engine.pipeline.loading import load_pipeline

    return load_pipeline(base_settings)


def test_the_wait_uses_no_cpu(own_loaded) -> None:
    pipe = own_loaded.pipe
    # The contrast: the real call of the same pipeline keeps this thread on a core.
    cpu = time.thread_time()
    pipe(prompt="a lighthouse", num_inference_steps=2, width=64, height=64)
    real_cpu = time.thread_time() - cpu
    install_standin_gpu(pipe, _WAIT_S)
    cpu, wall = time.thread_time(), time.perf_counter()
    output = pipe(prompt="a lighthouse", num_inference_steps=2, width=64, height=64)
    waited_cpu, waited = time.thread_time() - cpu, time.perf_counter() - wall
    assert waited >= _WAIT_S  # it did wait (sleep's guarantee), and for that time held this thread's core...
    assert waited_cpu < 0.05 * _WAIT_S < real_cpu  # ...for under a twentieth of it (the real call: all of it)
    assert [image.size for image in output.images] == [(64, 64)]


def test_an_engine_runs_one_wait_at_a_time(own_loaded, base_settings, hub) -> None:
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.hub import HubSource

    guard, running, most, waits = threading.Lock(), [0], [0], []

    def wait(seconds: float) -> None:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        waits.append(seconds)
        time.sleep(seconds)
        with guard:
            running[0] -= 1

    install_standin_gpu(own_loaded.pipe, _WAIT_S, wait=wait)
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url), local_dir=base_settings.local_lora_dir, token=None, max_bytes=2**30
    )
    engine = Engine(own_loaded, base_settings, resolver)
    try:
        request = GenerateRequest(prompt="a lighthouse", steps=2, width=64, height=64, seed=1)
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: generate(engine, request), range(3)))
    finally:
        engine.close()
    assert waits == [_WAIT_S / 2] * 6  # every request's images came from the stand-in, a step at a time...
    assert most[0] == 1  # ...one at a time, as on one GPU
    assert all(r.timings.inference >= _WAIT_S for r in results)


@pytest.mark.ray
def test_a_replica_waiting_on_the_standin_gpu_uses_no_cpu(base_settings, fixtures) -> None:
    """A replica's process, measured from outside: its CPU time across a request is a small part of the wait."""
    pytest.importorskip("ray.serve")
    import httpx
    import psutil

    from serving.cluster.app import local_cluster
    from tests.support.app_server import free_port

    wait = 4.0
    settings = base_settings.replace(
        cluster_replicas=1, cluster_gpus_per_replica=0.0, cluster_cpu_threads=1, cluster_standin_gpu_s=wait
    )
    body = {"inputs": "a lighthouse", "parameters": {"num_inference_steps": 2, "seed": 3}}
    with local_cluster(settings, port=free_port(), name="standin") as url:
        assert httpx.post(url, json=body, timeout=300).status_code == 200  # the first request warms the path
        # Ray titles each replica's process `ray::ServeReplica:<app>:<deployment>`; the pool's is the one not the
        # ingress.
        (replica,) = [
            p
            for p in psutil.process_iter(["cmdline"])
            if any("ServeReplica:standin:pool" in part for part in p.info["cmdline"] or ())
        ]
        before = replica.cpu_times()
        answer = httpx.post(url, json=body, timeout=300)
        after = replica.cpu_times()
    timing = dict(part.split("=") for part in answer.headers["x-timing"].split(";"))
    assert answer.status_code == 200 and float(timing["inference"]) >= wait
    cpu = (after.user + after.system) - (before.user + before.system)
    assert cpu < 0.25 * wait  # the whole request, wait included, kept the replica on a core for under a quarter of it


@pytest.mark.parametrize("step", [True, False], ids=["step", "run"])
def test_the_standin_is_shared_step_by_step_as_a_gpu(own_loaded, step) -> None:
    # The engine's step callback, as `engine.pipeline.inference.infer` makes it: a boundary at each step's end.
    pipe, log = own_loaded.pipe, []
    install_standin_gpu(pipe, 1.2, wait=lambda seconds: None)  # no sleep: the order is what is checked
    scheduler = DeviceScheduler(first_guess_s=1e-9)
    images: list[tuple[threading.Thread, list[BaseException]]] = []

    def run(pool: str, steps: int, mid_step=lambda step: None) -> None:
        with scheduler.turn(pool, steps, video=pool == "wan", step=step) as turn:

            def on_step(pipe, index, timestep, kwargs):
                log.append((pool, index))
                mid_step(index)
                turn.boundary(steps - index - 1)
                return kwargs

            pipe(prompt="a fox", num_inference_steps=steps, width=64, height=64, callback_on_step_end=on_step)

    def image_arrives(index: int) -> None:
        if index == 2:  # during the video's third step
            images.append(started(lambda: run("sdxl", 2)))
            until(lambda: scheduler.waiting == 1)

    run("wan", 12, image_arrives)
    ((thread, errors),) = images
    thread.join(WAIT_S)
    assert not errors
    order = [pool for pool, _ in log]
    # Step sharing: the image's two steps at the video's next boundary; the whole-run lock: after the video.
    assert order == (["wan"] * 3 + ["sdxl"] * 2 + ["wan"] * 9 if step else ["wan"] * 12 + ["sdxl"] * 2)


class _Logged(DeviceScheduler):
    """The scheduler, with each run's pieces and each boundary (the pieces left) written into a shared log."""

    def __init__(self, log: list[tuple[str, float]]) -> None:
        super().__init__(first_guess_s=1e-9)
        self.log = log

    def boundary(self, run, remaining: int, *, share: bool) -> None:
        self.log.append(("boundary", remaining))
        super().boundary(run, remaining, share=share)


def test_a_video_waits_a_piece_at_a_time_through_the_device_scheduler(base_settings, tiny_wan_dir, loaded_wan):
    from engine.pipeline.loading import load_pipeline
    from tests.support.dit import local_engine

    settings = base_settings.replace(
        model_id=str(tiny_wan_dir), base_model_id=loaded_wan.base_model_id, device_sharing="step"
    )
    loaded = load_pipeline(settings)  # its own: the stand-in changes its class and its blocks' forwards
    log: list[tuple[str, float]] = []
    waits = VideoWaits(step_s=0.8, chunk_s=0.3)
    install_standin_gpu(loaded.pipe, 0.5, lambda s: log.append(("wait", s)), family=loaded.family, video=waits)
    scheduler = _Logged(log)
    request = GenerateRequest(prompt="a fox", steps=3, width=64, height=64, seed=1, num_frames=9, guidance=5.0)
    with scheduler_for(torch.device("cpu"), scheduler), local_engine(loaded, settings) as engine:
        result = generate(engine, request)
        pieces = run_pieces(loaded.pipe, engine.check(request), loaded.family)
    blocks = len(loaded.pipe.transformer.blocks)
    # 3 steps of 2 guidance passes through the blocks, then 3 decode chunks (9 frames: 1 + 8 / 4), as the engine
    # counts a run's pieces; each a wait, a boundary between each two.
    assert pieces == 3 * 2 * blocks + 3
    expected = [0.8 / (2 * blocks)] * (3 * 2 * blocks) + [0.3] * 3
    assert [seconds for kind, seconds in log if kind == "wait"] == pytest.approx(expected)
    assert [entry[0] for entry in log] == ["wait", "boundary"] * (pieces - 1) + ["wait"]
    assert [left for kind, left in log if kind == "boundary"] == list(range(pieces - 1, 0, -1))
    assert len(result.frames) == 9 and result.frames[0].getpixel((0, 0)) == (128, 128, 128)
