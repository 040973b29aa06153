"""Which runs share a device and how (`DEVICE_SHARING`), and the one `DeviceScheduler` of each device.

`auto` shares a persistent CUDA device step by step (`engine.pipeline.stepshare`); on ZeroGPU each call has its
own GPU, so its runs keep the whole-run lock (`run`) and nothing is shared step by step; on the CPU no run waits
for another (`off`), unless a setting turns sharing on (the tests and `bench.mixed` do, on the tiny pipelines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import torch

from engine.devices import normal_device
from engine.events import EngineEvents, RunShare
from engine.models import HUB_ID
from engine.pipeline.inference import decode_pieces, run_pieces, step_pieces
from engine.pipeline.stepshare import Ahead, DeviceScheduler

if TYPE_CHECKING:
    from engine.pipeline.loading import LoadedPipeline
    from engine.requests import CheckedRequest
    from engine.settings import Settings

__all__ = [
    "Pool",
    "Sharing",
    "device_ahead_s",
    "device_scheduler",
    "device_turn",
    "pool_name",
    "pool_turn",
    "scheduler_for",
    "sharing_mode",
]

Sharing = Literal["step", "run", "off"]

_SCHEDULERS: dict[str, DeviceScheduler] = {}
_SCHEDULERS_GUARD = threading.Lock()


def sharing_mode(setting: str, device: torch.device, *, per_call: bool) -> Sharing:
    """`DEVICE_SHARING` for `device`: `auto` is step sharing on a persistent CUDA device, the whole-run lock on
    ZeroGPU (each call has its own GPU: nothing to share) and none on the CPU (no device to wait for)."""
    if setting != "auto":
        return cast(Sharing, setting)
    if device.type != "cuda":
        return "off"
    return "run" if per_call else "step"


def device_scheduler(device: torch.device) -> DeviceScheduler:
    """The one scheduler of `device` (`cuda` and `cuda:0` are one device)."""
    key = str(normal_device(device)) if device.type == "cuda" else device.type
    with _SCHEDULERS_GUARD:
        return _SCHEDULERS.setdefault(key, DeviceScheduler())


@contextmanager
def scheduler_for(device: torch.device, scheduler: DeviceScheduler) -> Iterator[DeviceScheduler]:
    """`device`'s scheduler is `scheduler` inside the block (a stand-in device's clock: tests, `bench.mixed`)."""
    key = str(normal_device(device)) if device.type == "cuda" else device.type
    with _SCHEDULERS_GUARD:
        before = _SCHEDULERS.get(key)
        _SCHEDULERS[key] = scheduler
    try:
        yield scheduler
    finally:
        with _SCHEDULERS_GUARD:
            if before is None:
                _SCHEDULERS.pop(key, None)
            else:
                _SCHEDULERS[key] = before


@contextmanager
def device_turn(
    sharing: Sharing,
    device: torch.device,
    pool: str,
    pieces: int,
    *,
    video: bool,
    starve: float,
    cancel: threading.Event | None,
    step_pieces: int = 1,
    chunks: int = 0,
    on_wait: Callable[[Ahead], None] | None,
    on_share: Callable[[RunShare], None] | None = None,
) -> Iterator[Callable[[int], None] | None]:
    """A run's turn on `device` as `sharing` says: the boundary its pipeline calls at each piece's end (None: no
    sharing). Under the whole-run lock (`run`) the boundary never pauses the run, but counts the pieces it has left
    and times each piece: without it a waiting request's place and Retry-After would count the whole run as each of
    its pieces."""
    if sharing == "off":
        yield None
        return
    scheduler = device_scheduler(device)
    step = sharing == "step"
    turn = scheduler.turn(
        pool,
        pieces,
        video=video,
        starve=starve,
        step_pieces=step_pieces,
        step=step,
        chunks=chunks,
        cancel=cancel,
        on_wait=on_wait,
        on_share=on_share,
    )
    with turn as held:
        yield held.boundary


class Pool(Protocol):
    """What a pool's run reads here (an `engine.pools.engine.Engine`)."""

    settings: Settings
    loaded: LoadedPipeline
    events: EngineEvents


def pool_turn(
    pool: Pool,
    pipe: Any,
    request: CheckedRequest,
    cancel: threading.Event | None,
    progress: object,
) -> AbstractContextManager[Callable[[int], None] | None]:
    """A pool's run of `request` on `pipe`, its turn on the device as `DEVICE_SHARING` says; a `progress` with a
    `waiting(Ahead)` method hears what the run waits behind (the UI's "waiting for the GPU"); the pool's events
    hear its share of the device."""
    settings, loaded = pool.settings, pool.loaded
    return device_turn(
        sharing_mode(settings.device_sharing, loaded.device, per_call=settings.per_call),
        loaded.device,
        pool_name(loaded),
        run_pieces(pipe, request, loaded.family),
        video=bool(request.num_frames),
        starve=settings.step_sharing_starve_steps,
        cancel=cancel,
        step_pieces=step_pieces(pipe, request, loaded.family),
        chunks=decode_pieces(pipe, request),
        on_wait=getattr(progress, "waiting", None),
        on_share=pool.events.device_shared,
    )


def pool_name(loaded: LoadedPipeline) -> str:
    """The pool as the device's scheduler and the metrics name it: its model's Hub id, or for a local folder (its
    name says little: "pipeline") its base."""
    return loaded.model_name if HUB_ID.match(loaded.model_id) else loaded.base_model_id


def device_ahead_s(loaded: LoadedPipeline, own_s: float) -> float:
    """The device time other pools' runs on `loaded`'s device take before a run of it needing `own_s` ends
    (`DeviceScheduler.ahead_s`; 0 where the device is not shared)."""
    return device_scheduler(loaded.device).ahead_s(pool_name(loaded), own_s)
