"""`bench.mixed` on this CPU: the tiny SDXL and Wan pipelines as two pools served by the real engine
(`LocalBackend`), once with the whole-run lock (`DEVICE_SHARING=run`) and once with step sharing (`step`), on the
same arrivals, scaled to the tiny pipelines' own times measured here first. Every result is compared with its
request's solo run (same seed, same weights): `exact`. With `--device cuda` the pools are loaded on the GPU
(float32, as here) and the same replay measures its real step times there."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from engine.families.tiny_wan import tiny_wan_transformer
from engine.families.wan import FAMILY as WAN_FAMILY
from engine.pipeline.loading import load_pipeline
from engine.pipeline.sharing import Sharing, scheduler_for
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest
from engine.settings import PoolSetting, Settings
from families import IDENTITIES, TINY_MODEL_IDS, Family
from serving.backends import blocking
from serving.backends.local import LocalBackend

from .mixed_model import Arrival, Figures, Recorded, arrivals, figures, replay

if TYPE_CHECKING:
    from .mixed import Options

SDXL, WAN = IDENTITIES[Family.SDXL].model_id, IDENTITIES[Family.WAN].model_id
_TINY = {base: tiny for tiny, base in TINY_MODEL_IDS.items()}
# A video many times an image, as on a GPU (there 50 times; here the tiny encoders weigh on an image).
IMAGE_STEPS, VIDEO_STEPS, VIDEO_FRAMES = 2, 400, 9
# Distinct requests per kind (seeds): each one's solo run is the reference for every copy of it in a replay.
SEEDS = 3


def request(arrival: Arrival) -> tuple[GenerateRequest, str]:
    seed = arrival.index % SEEDS
    if arrival.video:
        video = GenerateRequest(
            prompt="a fox running", steps=VIDEO_STEPS, width=64, height=64, num_frames=VIDEO_FRAMES, seed=seed
        )
        return video, WAN
    return GenerateRequest(prompt="a fox in a forest", steps=IMAGE_STEPS, width=64, height=64, seed=seed), SDXL


def _backend(mode: Sharing, device: str) -> LocalBackend:
    settings = Settings(
        model_id=_TINY[SDXL],
        model_id_explicit=True,
        base_model_id=SDXL,
        pools=(PoolSetting(_TINY[SDXL], SDXL), PoolSetting(_TINY[WAN], WAN)),
        device=device,
        dtype="float32",
        device_sharing=mode,
        previews=False,
        max_steps=VIDEO_STEPS,
        # Every arrival is queued (on a loaded CPU the runs take longer than their solo times).
        max_queue=10_000,
    )
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=settings.max_adapter_bytes)
    return LocalBackend(build_pools(settings, resolver, load_pipeline, warm=False))


def _bytes(result: Any) -> bytes:
    return b"".join(f.tobytes() for f in (result.frames or (result.image,)))


def cpu_replays(options: Options) -> tuple[Figures, Figures, bool]:
    """The whole-run lock's figures, step sharing's, and whether every result equalled its solo run."""
    # One thread: the CPU is the one device the runs share (and on a shared machine more threads stall); on CUDA the
    # host thread only launches the kernels.
    torch.set_num_threads(1)
    modes: tuple[Sharing, ...] = ("run", "step")
    backends = {mode: _backend(mode, options.device) for mode in modes}
    solo: dict[tuple[bool, int], bytes] = {}
    took: dict[bool, float] = {}
    for video in (False, True):
        for seed in range(SEEDS):
            work, base = request(Arrival(0.0, video, seed))
            started = time.perf_counter()
            solo[video, seed] = _bytes(blocking(backends["step"].generate(work, base=base)))
            took[video] = time.perf_counter() - started  # the last, warm
    # A step of the video: its guidance passes (the default guidance's) through each block of the tiny transformer,
    # each block a piece of its device time (`run_pieces`).
    step_pieces = WAN_FAMILY.guidance_passes * len(tiny_wan_transformer().blocks)
    video_step_s = took[True] * step_pieces / (VIDEO_STEPS * step_pieces + (VIDEO_FRAMES - 1) // 4 + 1)
    plan = arrivals(
        duration_s=options.cpu_videos * took[True] * options.video_every,
        image_s=took[False],
        image_load=options.image_load,
        video_every_s=took[True] * options.video_every,
        seed=options.seed,
    )
    same = True
    found = []
    for mode in ("run", "step"):
        backend = backends[mode]

        def run(arrival: Arrival, backend: LocalBackend = backend) -> None:
            nonlocal same
            work, base = request(arrival)
            made = _bytes(blocking(backend.generate(work, base=base)))
            same = same and made == solo[arrival.video, arrival.index % SEEDS]

        scheduler = Recorded()
        with scheduler_for(torch.device(options.device), scheduler):
            found.append(figures(replay(plan, 1.0, run, scheduler), took[False], video_step_s))
    for backend in backends.values():
        backend.close()
    return found[0], found[1], same
