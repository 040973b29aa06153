"""Runs paused on the device and resumed (issue 48) through the engine, on the tiny pipelines with step sharing on
(DEVICE_SHARING=step on the CPU): a tiny Wan video paused at several steps and inside its VAE decode, and a tiny
SDXL image paused at several steps, each give the bytes of the same run unpaused; a video cancelled while paused
leaves at once and its pool serves exactly what it served before. A pause is forced by a rival run (another
pool's, one piece) sent to the device at that boundary: it goes first, having less left."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import GenerationCancelledError
from engine.events import RunShare
from engine.pipeline.sharing import scheduler_for
from engine.pipeline.stepshare import DeviceScheduler
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate
from tests.support.dit import local_engine
from tests.support.stepshare import Rivals, until
from tests.support.wan import CASES, FRAMES, PROMPT, write_wan_loras

CPU = torch.device("cpu")


def video(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=loras, steps=4, width=64, height=64, seed=seed, num_frames=FRAMES)


def image(seed: int = 3) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, steps=5, seed=seed)


@contextmanager
def in_decode(pipe: Any, rivals: Rivals, chunk: int) -> Iterator[None]:
    """A rival sent before the video VAE decoder's `chunk`-th call (hooks run in order: this one before the
    engine's boundary), so the run pauses inside its decode."""
    calls = [0]

    def before(module: torch.nn.Module, args: object) -> None:
        calls[0] += 1
        if calls[0] == chunk:
            rivals.send()

    handle = pipe.vae.decoder.register_forward_pre_hook(before)
    try:
        yield
    finally:
        handle.remove()
    assert calls[0] >= chunk


@pytest.fixture
def shared() -> Iterator[tuple[DeviceScheduler, list[RunShare]]]:
    # A rival's one piece counts as nearly nothing until measured, so it always has less left than a paused run.
    scheduler = DeviceScheduler(first_guess_s=1e-9)
    shares: list[RunShare] = []
    scheduler.subscribe(shares.append)
    with scheduler_for(CPU, scheduler):
        yield scheduler, shares


@pytest.fixture(scope="module")
def wan_loras(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stepshare-wan-loras")
    write_wan_loras(loaded_wan.pipe, folder, CASES[:2])
    return folder


@pytest.fixture
def wan_engine(loaded_wan, base_settings, wan_loras):
    settings = base_settings.replace(
        device_sharing="step", local_lora_dir=wan_loras, base_model_id=loaded_wan.base_model_id
    )
    with local_engine(loaded_wan, settings, wan_loras) as engine:
        yield engine


def frames(result: Any) -> list[bytes]:
    return [frame.tobytes() for frame in result.frames]


def test_a_video_paused_at_several_steps_and_inside_its_decode_gives_the_unpaused_bytes(wan_engine, shared):
    scheduler, shares = shared
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    alone = frames(generate(wan_engine, video(lora)))
    rivals = Rivals(scheduler)
    with in_decode(wan_engine.loaded.pipe, rivals, chunk=2):
        paused = frames(generate(wan_engine, video(lora), progress=rivals.at_steps({1, 2, 3})))
    rivals.join()
    assert paused == alone
    run = next(s for s in shares[::-1] if s.pool != "rival")
    assert run.video and run.pauses == 4 and [s.pool for s in shares].count("rival") == 4


def test_an_image_paused_at_several_steps_gives_the_unpaused_bytes(base_settings, loaded, shared):
    scheduler, shares = shared
    settings = base_settings.replace(device_sharing="step")
    with local_engine(loaded, settings, settings.local_lora_dir) as sdxl:
        alone = generate(sdxl, image()).image.tobytes()
        rivals = Rivals(scheduler)
        paused = generate(sdxl, image(), progress=rivals.at_steps({1, 3, 4})).image.tobytes()
        rivals.join()
    assert paused == alone
    assert [s.pauses for s in shares if s.pool != "rival"][-1] == 3


def test_a_video_cancelled_while_paused_leaves_at_once_and_its_pool_serves_what_it_served(wan_engine, shared):
    scheduler, _ = shared
    served = video(LoraSpec(f"local:{CASES[0].file_name}"))
    before = frames(generate(wan_engine, served))
    cancel = threading.Event()

    def hold() -> None:
        # The video is paused behind this rival: cancelling it ends it while the rival still holds the device.
        cancel.set()
        until(lambda: scheduler.waiting == 0)

    rivals = Rivals(scheduler, hold)
    other = video(LoraSpec(f"local:{CASES[1].file_name}", scale=0.7), seed=9)
    with pytest.raises(GenerationCancelledError):
        generate(wan_engine, other, cancel=cancel, progress=rivals.at_steps({2}))
    rivals.join()
    assert not scheduler.busy and scheduler.waiting == 0
    assert frames(generate(wan_engine, served)) == before
