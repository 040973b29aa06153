"""The service `bench.soak` runs: the tiny pools behind the real app, their LoRAs on the stand-in Hub, the input
images, and what the soak watches on the server side (imported only after the Hub's environment is set, as
`bench.serve_run`).

Five pools: the tiny SDXL in float32 (the default pool, which the bursts fill), the tiny SD 1.5 in bf16, beside
it the tiny FLUX.1 with its denoiser quantized (fp8, LoRAs as branches of `LORA_MAX_RANK`, computing in bf16),
the tiny Wan 2.1 (videos) and the tiny FLUX.2 [klein] (edits from several reference images), both in float32 and
asked for by base (`/models/<base>`, `base`), without LoRAs. LoRAs, by role (the client process draws from them;
`Catalogue.to_json` hands it the names):

- `good` (tiny SDXL), `sd15` (tiny SD 1.5) and `flux` (the quantized FLUX): served, each routed to its pool by its
  card;
- `slow`: served, each download held `SLOW_S` at the Hub;
- `cut`: served, except while the soak cuts their downloads at the Hub (`CUT_PREFIX` paths);
- `refused`: downloaded, then refused (NaN values, factors that fit nothing, a rank over `MAX_RANK`, OFT, a
  FLUX card on SDXL factors, a FLUX LoRA over the branches' rank): 4xx answers, and files the disk budget must
  absorb.

Input images (`write_images`): a good image and masks (one of another size: resized, with a warning), files that
are no image, cut off, or of a refused format, and `oversized`: a 12000 x 12000 PNG of about 450 KB, whose pixels
are over `MAX_INPUT_PIXELS` (decoded, 432 MB); for the klein pool's edits a second reference, and `solid`: a
2656 x 2656 WebP of one colour, 340 bytes (decoded, 21 MB), which the clients send 60 times in one request, far
over the pool's count (`OVER_COUNT`).

`SoakBackend` is the app's `LocalBackend`, noting when each request (by its seed) reached the GPU, so that a
request run after its client left (a ghost) can be told apart from one that was running when it left.
"""

from __future__ import annotations

import io
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
from PIL import Image
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from app import build_demo
from engine.pipeline.loading import LoadedPipeline, load_pipeline
from engine.pools.pools import Pool, Pools, build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import TINY_MODEL_ID, PoolSetting, Settings
from engine.weights.quantized import BranchedLinear
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.flux import TINY_ID as TINY_FLUX_MODEL_ID
from families.flux2 import MODEL_ID as KLEIN_MODEL_ID
from families.flux2 import TINY_ID as TINY_KLEIN_MODEL_ID
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from families.sd15 import TINY_ID as TINY_SD15_MODEL_ID
from families.wan import MODEL_ID as WAN_MODEL_ID
from families.wan import TINY_ID as TINY_WAN_MODEL_ID
from lora_catalog.catalog import Catalog
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.demo.synthetic import find_targets, make_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
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

__all__ = [
    "CUT_PREFIX",
    "KLEIN_MODEL_ID",
    "OVER_COUNT",
    "SLOW_S",
    "WAN_MODEL_ID",
    "Catalogue",
    "Service",
    "SoakBackend",
    "soak_settings",
    "write_images",
]

# A slow download: long against a tiny request, short of the clients' 10 s download timeout.
SLOW_S = 2.5
CUT_PREFIX = "/soak/cut-"
_ROLES = ("good", "sd15", "flux", "slow", "cut", "refused")
# The quantized pool's branch rank: the `refused` FLUX LoRA is over it.
BRANCH_RANK = 8
OVERSIZED_SIDE = 12_000
# The references an over-count edit sends (the klein pool takes 4 images in all), each a solid `SOLID_SIDE`² WebP.
OVER_COUNT, SOLID_SIDE = 60, 2656
# How old Gradio's files get before it deletes them (TEMP_FILES_MAX_AGE_S): within even a short run.
TEMP_FILES_MAX_AGE_S = 60


# The pools loaded in bf16 (`DTYPE` is one setting: the soak's loader gives these theirs, as a GPU's `auto` would).
BF16_BASES = (SD15_MODEL_ID, FLUX_MODEL_ID)
# Each pool's (storage, dtype) once loaded, in `soak_settings`' order.
_LOADED = (
    ("native", "torch.float32"),
    ("native", "torch.bfloat16"),
    ("fp8", "torch.bfloat16"),
    ("native", "torch.float32"),
    ("native", "torch.float32"),
)


def soak_settings(max_queue: int) -> Settings:
    """Five tiny pools (SDXL, SD 1.5, FLUX.1 with its denoiser in fp8, Wan 2.1 and FLUX.2 [klein]) with small
    budgets, so that the soak presses on each; `load` gives two of them bf16."""
    return Settings(
        model_id=TINY_MODEL_ID,
        model_id_explicit=True,
        base_model_id=SDXL,
        pools=(
            PoolSetting(TINY_MODEL_ID, SDXL),
            PoolSetting(TINY_SD15_MODEL_ID, SD15_MODEL_ID),
            PoolSetting(TINY_FLUX_MODEL_ID, FLUX_MODEL_ID, quantize="fp8"),
            PoolSetting(TINY_WAN_MODEL_ID, WAN_MODEL_ID),
            PoolSetting(TINY_KLEIN_MODEL_ID, KLEIN_MODEL_ID),
        ),
        device="cpu",
        dtype="float32",
        lora_max_rank=BRANCH_RANK,
        max_queue=max_queue,
        prepare_workers=2,
        max_rank=32,
        # About 6 of its LoRA files on disk, 12 prepared in host RAM per pool.
        disk_cache_bytes=2**20,
        host_cache_bytes=4 * 2**20,
        device_cache_bytes=4 * 2**20,
        hub_timeout_s=5.0,
        max_compare_steps=40,
        temp_files_max_age_s=TEMP_FILES_MAX_AGE_S,
    )


@dataclass(frozen=True)
class Catalogue:
    """The soak's LoRA repos by role."""

    roles: dict[str, tuple[str, ...]]

    def to_json(self) -> dict[str, list[str]]:
        return {role: list(repos) for role, repos in self.roles.items()}


def publish(hub: StandInHub, sdxl_pipe: object, sd15_pipe: object, flux_pipe: object) -> Catalogue:
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
    layers = flux_layers(flux_pipe.transformer)  # type: ignore[attr-defined]
    for index in range(3):
        flux = make_flux_lora(layers, rank=4, seed=1250 + index, alpha=4.0)
        add("flux", f"{index}", {"README.md": card(FLUX), WEIGHTS: sft(flux.twin())})
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
    wide = make_flux_lora(layers, rank=2 * BRANCH_RANK, seed=1502, alpha=4.0)
    add("refused", "flux-rank", {"README.md": card(FLUX), WEIGHTS: sft(wide.twin())})
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
        self.pools = build_pools(self.settings, resolver, load, warm=False)
        loaded = [(p.engine.loaded.storage, str(p.engine.loaded.dtype)) for p in self.pools.pools]
        if loaded != [*_LOADED]:
            expected = "SDXL float32, SD 1.5 bf16, FLUX fp8, Wan and klein float32"
            raise RuntimeError(f"the soak's pools loaded as {loaded}; expected {expected}")
        self.catalogue = publish(self.hub, *(p.engine.loaded.pipe for p in self.pools.pools[:3]))
        self.images = write_images(root / "images")
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
        """After `close`: every weight and buffer of every pool byte-identical to what was loaded (the quantized
        pool's fp8 values and row scales too), and every LoRA branch of the quantized pool back to zero."""
        now = [_weights(p.engine.loaded.pipe) for p in self.pools.pools]
        same = all(
            before.keys() == after.keys() and all(_same_bytes(after[name], value) for name, value in before.items())
            for before, after in zip(self.pristine, now, strict=True)
        )
        return same and all(_branches_zero(p.engine.loaded.pipe) for p in self.pools.pools)

    def close(self) -> None:
        self.demo.close()
        self.pools.close()
        self.catalog.close()
        self.hub.stop()


def load(settings: Settings, **options: Any) -> LoadedPipeline:
    """`load_pipeline`, in bf16 for the `BF16_BASES` pools."""
    if settings.base_model_id in BF16_BASES:
        settings = settings.replace(dtype="bfloat16")
    return load_pipeline(settings, **options)


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


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality, fp8 included (`torch.equal` compares values, and not every dtype on every device)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _branches_zero(pipe: object) -> bool:
    """Every `BranchedLinear` of the pipeline holds no LoRA: its branch buffers all zero, its branch rank 0."""
    modules = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]  # type: ignore[attr-defined]
    return all(
        module.branch_rank == 0
        and not any(bool(buffer.any()) for buffer in (module.lora_down, module.lora_up, module.lora_scales))
        for component in modules
        for module in component.modules()
        if isinstance(module, BranchedLinear)
    )


def write_images(folder: Path) -> dict[str, object]:
    """The soak's input files: `image`, `mask`, `mask_other` (another size), `bad` (no image, cut off, a GIF),
    `oversized`, `reference` (a second image for an edit) and `solid` (an over-count edit's reference); paths as
    strings, for the client process."""
    folder.mkdir(parents=True, exist_ok=True)
    noise = [Image.effect_noise((64, 64), 40 + 10 * channel) for channel in range(3)]
    image = Image.merge("RGB", noise)  # noise: a PNG of some 12 KB, so that half of it is cut off mid-pixels
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    files = {
        "image.png": _encoded(image, "PNG"),
        "mask.png": _encoded(mask, "PNG"),
        "mask_other.png": _encoded(Image.new("L", (48, 40), 255), "PNG"),
        "not_an_image.png": b"this is not an image, whatever its name says\n" * 4,
        "cut_off.png": _encoded(image, "PNG")[: len(_encoded(image, "PNG")) // 2],
        "animation.gif": _encoded(image, "GIF"),
        "reference.png": _encoded(Image.merge("RGB", noise[::-1]), "PNG"),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    oversized = folder / "oversized.png"
    _write_blank_png(oversized, OVERSIZED_SIDE, OVERSIZED_SIDE)
    Image.new("RGB", (SOLID_SIDE, SOLID_SIDE), (90, 120, 200)).save(folder / "solid.webp", lossless=True)
    return {
        "image": str(folder / "image.png"),
        "mask": str(folder / "mask.png"),
        "mask_other": str(folder / "mask_other.png"),
        "bad": [str(folder / name) for name in ("not_an_image.png", "cut_off.png", "animation.gif")],
        "oversized": str(oversized),
        "reference": str(folder / "reference.png"),
        "solid": str(folder / "solid.webp"),
    }


def _encoded(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def _write_blank_png(path: Path, width: int, height: int) -> None:
    """A black RGB PNG of `width` x `height`, compressed row by row (never held whole: 432 MB at 12000²)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(9)
    rows = (b"\0" * (1 + 3 * width)) * 100  # each row: filter type 0, then its pixels
    body = bytearray()
    for start in range(0, height, 100):
        body += packer.compress(rows if start + 100 <= height else rows[: (height - start) * (1 + 3 * width)])
    body += packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", bytes(body)) + chunk(b"IEND", b""))


def _plain(value: object) -> object:
    return value if isinstance(value, str | int | float | bool | type(None)) else None
