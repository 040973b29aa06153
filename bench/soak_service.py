"""The service `bench.soak` runs: the tiny pools behind the real app, their LoRAs on the stand-in Hub, and what
the soak watches on the server side (imported only after the Hub's environment is set, as `bench.serve_run`).

LoRAs, by role (the client process draws from them; `Catalogue.to_json` hands it the names):

- `good` (tiny SDXL) and `sd15` (tiny SD 1.5): served, each routed to its pool by its card;
- `slow`: served, each download held `SLOW_S` at the Hub;
- `cut`: served, except while the soak cuts their downloads at the Hub (`CUT_PREFIX` paths);
- `refused`: downloaded, then refused (NaN values, factors that fit nothing, a rank over `MAX_RANK`, OFT, a
  FLUX card, SD 1.5 metadata on an SDXL-only path): 4xx answers, and files the disk budget must absorb.

`SoakBackend` is the app's `LocalBackend`, noting when each request (by its seed) reached the GPU, so that a
request run after its client left (a ghost) can be told apart from one that was running when it left.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from app import build_demo
from engine.pipeline.loading import load_pipeline
from engine.pools.pools import Pool, Pools, build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import SD15_MODEL_ID, TINY_MODEL_ID, TINY_SD15_MODEL_ID, PoolSetting, Settings
from lora_catalog.catalog import Catalog
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.demo.synthetic import find_targets, make_lora
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.ui.launch import serve
from tests.support.app_server import free_port
from tests.support.loras import (
    FLUX,
    SDXL,
    WEIGHTS,
    card,
    kohya_file,
    peft_file,
    sft,
    variant_file,
    with_nan,
    wrong_shapes,
)
from tests.support.standin_hub import StandInHub

__all__ = ["CUT_PREFIX", "SLOW_S", "Catalogue", "Service", "SoakBackend", "soak_settings"]

# A slow download: long against a tiny request, short of the clients' 10 s download timeout.
SLOW_S = 2.5
CUT_PREFIX = "/soak/cut-"
_ROLES = ("good", "sd15", "slow", "cut", "refused")


def soak_settings(max_queue: int) -> Settings:
    """Two tiny pools (SDXL, SD 1.5) with small budgets, so that the soak presses on each."""
    return Settings(
        model_id=TINY_MODEL_ID,
        model_id_explicit=True,
        base_model_id=SDXL,
        pools=(PoolSetting(TINY_MODEL_ID, SDXL), PoolSetting(TINY_SD15_MODEL_ID, SD15_MODEL_ID)),
        device="cpu",
        dtype="float32",
        max_queue=max_queue,
        prepare_workers=2,
        max_rank=32,
        # About 6 of its LoRA files on disk, 12 prepared in host RAM per pool.
        disk_cache_bytes=2**20,
        host_cache_bytes=4 * 2**20,
        device_cache_bytes=4 * 2**20,
        hub_timeout_s=5.0,
        max_compare_steps=40,
    )


@dataclass(frozen=True)
class Catalogue:
    """The soak's LoRA repos by role."""

    roles: dict[str, tuple[str, ...]]

    def to_json(self) -> dict[str, list[str]]:
        return {role: list(repos) for role, repos in self.roles.items()}


def publish(hub: StandInHub, sdxl_pipe: object, sd15_pipe: object) -> Catalogue:
    roles: dict[str, list[str]] = {role: [] for role in _ROLES}

    def add(role: str, name: str, files: dict[str, bytes]) -> None:
        repo = f"soak/{role}-{name}"
        hub.add_repo(repo, files, tags=["lora"])
        roles[role].append(repo)

    for index in range(8):
        add("good", f"{index}", {"README.md": card(SDXL), WEIGHTS: peft_file(sdxl_pipe, seed=1000 + index)})
    add("good", "kohya", {"README.md": card(SDXL), "style.safetensors": kohya_file(sdxl_pipe, seed=1100)})
    sd15_targets = find_targets({"unet": sd15_pipe.unet}, {"unet": (r"attn[12]\.to_(q|v)$",)})  # type: ignore[attr-defined]
    for index in range(4):
        tensors = make_lora(sd15_targets, rank=4, seed=1200 + index, fmt="peft", strength=0.3)
        add("sd15", f"{index}", {"README.md": card(SD15_MODEL_ID), WEIGHTS: sft(tensors)})
    for index in range(3):
        add("slow", f"{index}", {"README.md": card(SDXL), WEIGHTS: peft_file(sdxl_pipe, seed=1300 + index)})
    for index in range(3):
        add("cut", f"{index}", {"README.md": card(SDXL), WEIGHTS: peft_file(sdxl_pipe, seed=1400 + index)})
    refused = {
        "nan": with_nan(sdxl_pipe),
        "shapes": wrong_shapes(sdxl_pipe),
        "rank": peft_file(sdxl_pipe, seed=1500, rank=64),
        "oft": variant_file(sdxl_pipe, "oft"),
    }
    for name, data in refused.items():
        add("refused", name, {"README.md": card(SDXL), WEIGHTS: data})
    add("refused", "flux", {"README.md": card(FLUX), WEIGHTS: peft_file(sdxl_pipe, seed=1501)})
    for repo in roles["slow"]:
        hub.set_download_delay(repo, SLOW_S)
    return Catalogue({role: tuple(repos) for role, repos in roles.items()})


class SoakBackend(LocalBackend):
    """The app's backend, noting when each request reached the GPU (by seed, wall-clock time)."""

    def __init__(self, pools: Pools) -> None:
        super().__init__(pools)
        self._lock = threading.Lock()
        self.admitted: list[tuple[int, float]] = []

    def _note(self, seed: int | None) -> None:
        with self._lock:
            self.admitted.append((int(seed or 0), time.time()))

    def _call_gpu(self, pool: Pool, prepared, progress, preview, cancel):  # type: ignore[no-untyped-def]
        self._note(prepared.request.seed)
        return super()._call_gpu(pool, prepared, progress, preview, cancel)

    def _compare_cells(self, pool: Pool, prepared, progress, cancel):  # type: ignore[no-untyped-def]
        self._note(prepared[0].request.seed if prepared else None)
        return super()._compare_cells(pool, prepared, progress, cancel)


class Service:
    """The stand-in Hub with the soak's LoRAs, the two tiny pools and the launched app over them."""

    def __init__(self, root: Path, hub_port: int, max_queue: int) -> None:
        self.hub = StandInHub(root / "hub", port=hub_port)
        self.hub.start()
        self.settings = soak_settings(max_queue)
        self.catalog = Catalog(HubSource(endpoint=self.hub.url, timeout_s=5), local_dirs=(), refresh=False)
        resolver = AdapterResolver(
            self.catalog, local_dir=None, token=None, max_bytes=self.settings.max_adapter_bytes, timeout_s=5
        )
        self.pools = build_pools(self.settings, resolver, load_pipeline, warm=False)
        self.catalogue = publish(self.hub, *(p.engine.loaded.pipe for p in self.pools.pools))
        # Every weight as loaded, to check the base is bit-exact after the soak.
        self.pristine = [_weights(p.engine.loaded.pipe) for p in self.pools.pools]
        self.backend = SoakBackend(self.pools)
        handlers = Handlers(self.backend, self.catalog, self.settings)
        self.demo = build_demo(handlers)
        self.url = (
            serve(
                self.demo,
                [*http_routes(handlers), Route("/soak/idle", _idle, methods=["POST"])],
                server_name="127.0.0.1",
                server_port=free_port(),
                block=False,
                quiet=True,
            ).rstrip("/")
            + "/"
        )

    def endpoints(self) -> dict[str, dict[str, object]]:
        """What the clients join by hand (Gradio's queue protocol): each function's index, trigger and inputs."""
        wanted = {"generate_api", "compare_api", "prefetch"}
        found: dict[str, dict[str, object]] = {}
        for index, fn in self.demo.fns.items():
            if fn.name in wanted and fn.name not in found:
                found[fn.name] = {
                    "fn_index": index,
                    "trigger_id": fn.targets[0][0],
                    "data": [_plain(getattr(c, "value", None)) for c in fn.inputs],
                }
        return found

    def base_exact(self) -> bool:
        """After `close`: every weight of every pool equal to what was loaded."""
        return all(
            all(torch.equal(now[name], value) for name, value in before.items())
            for before, now in zip(
                self.pristine, (_weights(p.engine.loaded.pipe) for p in self.pools.pools), strict=True
            )
        )

    def close(self) -> None:
        self.demo.close()
        self.pools.close()
        self.catalog.close()
        self.hub.stop()


async def _idle(request: Request) -> Response:
    """One call into the server loop's worker threads: anyio stops a worker idle for 10 s only when a later call
    comes, so the soak calls this before it counts threads (an idle one is no leak, a blocked one stays)."""
    await anyio.to_thread.run_sync(lambda: None)
    return PlainTextResponse("idle")


def _weights(pipe: object) -> dict[str, torch.Tensor]:
    modules = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}  # type: ignore[attr-defined]
    return {
        f"{name}.{key}": value.detach().clone() for name, m in modules.items() for key, value in m.state_dict().items()
    }


def _plain(value: object) -> object:
    return value if isinstance(value, str | int | float | bool | type(None)) else None
