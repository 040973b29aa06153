"""One frozen `Settings`, built once from the environment.

This is the only module that reads environment variables (Gradio reads its own
`GRADIO_*` and huggingface_hub its own `HF_*` ones). Parsing is strict: a bad
value stops start-up with the accepted values listed.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.errors import SettingsError
from engine.pools.specs import (
    DEFAULT_MODEL_ID,
    HUB_ID,
    SD15_MODEL_ID,
    TINY_MODEL_ID,
    TINY_MODEL_IDS,
    TINY_SD15_MODEL_ID,
    PoolSetting,
    parse_models,
)

__all__ = [
    "DEFAULT_MODEL_ID",
    "SD15_MODEL_ID",
    "TINY_MODEL_ID",
    "TINY_MODEL_IDS",
    "TINY_SD15_MODEL_ID",
    "PoolSetting",
    "Settings",
    "parse_bytes",
    "parse_models",
]

_DEVICES = ("auto", "cpu", "cuda", "cuda:<index>", "mps")
_DTYPES = ("auto", "float32", "float16", "bfloat16")
_GPU_MODES = ("auto", "persistent", "per_call")
_PRISTINE = ("auto", "device", "cpu")
_SCHEDULERS = ("affinity", "fifo_inline")
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_HUB_ID = HUB_ID


def parse_bytes(name: str, raw: str) -> int:
    """Parse a byte size such as `4GiB`, `512MB` or `1048576`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", raw)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise SettingsError(
            f"{name}={raw!r} is not a byte size; accepted: a number with an optional unit "
            f"({', '.join(u for u in _UNITS if u)}), e.g. 4GiB"
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Settings:
    """Everything configurable, with the defaults a Space on an A10G wants."""

    model_id: str = DEFAULT_MODEL_ID
    model_id_explicit: bool = False
    base_model_id: str = DEFAULT_MODEL_ID
    # Empty: one pool, `model_id` checked against `base_model_id` (the MODEL_ID shorthand).
    pools: tuple[PoolSetting, ...] = ()
    pool_offload: bool = True
    device: str = "auto"
    dtype: str = "auto"
    vae_id: str | None = None
    gpu_mode: str = "auto"
    pristine_store: str = "auto"
    host_cache_bytes: int = 4 * 2**30
    device_cache_bytes: int = 2 * 2**30
    # SDXL's UNet and both text encoders in fp16 are about 6.5 GiB; a LoRA touching all of them fits.
    pristine_bytes: int = 7 * 2**30
    disk_cache_bytes: int = 20 * 2**30
    max_adapter_bytes: int = 1536 * 2**20
    max_rank: int = 256
    max_loras: int = 4
    max_steps: int = 60
    max_side: int = 1536
    max_prompt_chars: int = 2000
    max_queue: int = 16
    affinity_max_skip: int = 3
    prepare_workers: int = 2
    prepare_inflight_bytes: int = 2 * 2**30
    scheduler: str = "affinity"
    # Live previews while denoising (off for `POST /`, which answers with the final image only).
    previews: bool = True
    preview_vae: str = "auto"
    preview_every: int = 2
    # Comparison grids: cells per grid and denoising steps over all its cells.
    max_compare_cells: int = 6
    max_compare_steps: int = 150
    local_lora_dir: Path | None = None
    catalog_snapshot: Path | None = None
    catalog_refresh: bool = True
    hub_timeout_s: float = 10.0
    hf_token: str | None = field(default=None, repr=False)
    log_level: str = "INFO"
    zero_gpu: bool = False
    # GET /metrics (Prometheus text); off by default because a public Space would publish it to everyone.
    metrics: bool = False
    # With a URL, the Space is a front end: generation goes to that Ray Serve cluster (serving.cluster.app).
    backend_url: str | None = None
    backend_timeout_s: float = 600.0
    # The cluster's shape (serving.cluster.app): replicas per pool, requests a replica takes at once, adapter
    # sets each replica holds (Serve's multiplexed LRU, which the engine's prepared-adapter cache follows).
    cluster_replicas: int = 1
    cluster_max_ongoing: int = 1
    cluster_adapter_sets: int = 16
    cluster_gpus_per_replica: float = 1.0
    # Gradio's own variables, read here so nothing else reads the environment; a Space sets both.
    server_name: str = "0.0.0.0"
    server_port: int = 7860

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from `env` (pass `os.environ`); unknown keys are ignored."""
        get = {k: v for k, v in env.items() if v != ""}.get
        pools = _pools(get)
        model_id = pools[0].model_id if pools else get("MODEL_ID", DEFAULT_MODEL_ID).strip()
        if not model_id:
            raise SettingsError("MODEL_ID is empty; accepted: a Hub repo id, a local diffusers folder or 'tiny'")
        default_base = model_id if _HUB_ID.match(model_id) and not Path(model_id).exists() else DEFAULT_MODEL_ID
        default_base = TINY_MODEL_IDS.get(model_id, default_base)
        base_model_id = pools[0].base_model_id if pools else get("BASE_MODEL_ID", default_base).strip()
        if not _HUB_ID.match(base_model_id):
            raise SettingsError(f"BASE_MODEL_ID={base_model_id!r} is not a Hub repo id; accepted: 'owner/name'")
        settings = cls(
            model_id=model_id,
            model_id_explicit=bool(pools) or ("MODEL_ID" in env and bool(env["MODEL_ID"])),
            base_model_id=base_model_id,
            pools=pools,
            pool_offload=_bool("POOL_OFFLOAD", get("POOL_OFFLOAD", "on")),
            device=_device(get("DEVICE", "auto")),
            dtype=_choice("DTYPE", get("DTYPE", "auto"), _DTYPES),
            vae_id=get("VAE_ID"),
            gpu_mode=_choice("GPU_MODE", get("GPU_MODE", "auto"), _GPU_MODES),
            pristine_store=_choice("PRISTINE_STORE", get("PRISTINE_STORE", "auto"), _PRISTINE),
            host_cache_bytes=parse_bytes("HOST_CACHE_BYTES", get("HOST_CACHE_BYTES", "4GiB")),
            device_cache_bytes=parse_bytes("DEVICE_CACHE_BYTES", get("DEVICE_CACHE_BYTES", "2GiB")),
            pristine_bytes=parse_bytes("PRISTINE_BYTES", get("PRISTINE_BYTES", "7GiB")),
            disk_cache_bytes=parse_bytes("DISK_CACHE_BYTES", get("DISK_CACHE_BYTES", "20GiB")),
            max_adapter_bytes=parse_bytes("MAX_ADAPTER_BYTES", get("MAX_ADAPTER_BYTES", "1536MiB")),
            max_rank=_int("MAX_RANK", get("MAX_RANK", "256"), 1, 4096),
            max_loras=_int("MAX_LORAS", get("MAX_LORAS", "4"), 1, 8),
            max_steps=_int("MAX_STEPS", get("MAX_STEPS", "60"), 1, 500),
            max_side=_int("MAX_SIDE", get("MAX_SIDE", "1536"), 64, 4096),
            max_prompt_chars=_int("MAX_PROMPT_CHARS", get("MAX_PROMPT_CHARS", "2000"), 1, 100_000),
            max_queue=_int("MAX_QUEUE", get("MAX_QUEUE", "16"), 1, 10_000),
            affinity_max_skip=_int("AFFINITY_MAX_SKIP", get("AFFINITY_MAX_SKIP", "3"), 0, 1000),
            prepare_workers=_int("PREPARE_WORKERS", get("PREPARE_WORKERS", "2"), 1, 64),
            prepare_inflight_bytes=_positive_bytes("PREPARE_INFLIGHT_BYTES", get("PREPARE_INFLIGHT_BYTES", "2GiB")),
            scheduler=_choice("SCHEDULER", get("SCHEDULER", "affinity"), _SCHEDULERS),
            previews=_bool("PREVIEWS", get("PREVIEWS", "1")),
            preview_vae=_preview_vae(get("PREVIEW_VAE", "auto")),
            preview_every=_int("PREVIEW_EVERY", get("PREVIEW_EVERY", "2"), 1, 500),
            max_compare_cells=_int("MAX_COMPARE_CELLS", get("MAX_COMPARE_CELLS", "6"), 1, 16),
            max_compare_steps=_int("MAX_COMPARE_STEPS", get("MAX_COMPARE_STEPS", "150"), 1, 10_000),
            local_lora_dir=_dir("LOCAL_LORA_DIR", get("LOCAL_LORA_DIR")),
            catalog_snapshot=Path(snapshot) if (snapshot := get("CATALOG_SNAPSHOT")) else None,
            catalog_refresh=_bool("CATALOG_REFRESH", get("CATALOG_REFRESH", "true")),
            hub_timeout_s=_float("HUB_TIMEOUT_S", get("HUB_TIMEOUT_S", "10"), 0.1, 600.0),
            hf_token=get("HF_TOKEN"),
            log_level=_choice("LOG_LEVEL", get("LOG_LEVEL", "INFO").upper(), _LOG_LEVELS),
            zero_gpu=_bool("SPACES_ZERO_GPU", get("SPACES_ZERO_GPU", "false")),
            metrics=_bool("METRICS", get("METRICS", "false")),
            backend_url=_url("BACKEND_URL", get("BACKEND_URL")),
            backend_timeout_s=_float("BACKEND_TIMEOUT_S", get("BACKEND_TIMEOUT_S", "600"), 1.0, 86_400.0),
            cluster_replicas=_int("CLUSTER_REPLICAS", get("CLUSTER_REPLICAS", "1"), 1, 1024),
            cluster_max_ongoing=_int("CLUSTER_MAX_ONGOING", get("CLUSTER_MAX_ONGOING", "1"), 1, 64),
            cluster_adapter_sets=_int("CLUSTER_ADAPTER_SETS", get("CLUSTER_ADAPTER_SETS", "16"), 1, 4096),
            cluster_gpus_per_replica=_float("CLUSTER_GPUS_PER_REPLICA", get("CLUSTER_GPUS_PER_REPLICA", "1"), 0.0, 8.0),
            server_name=get("GRADIO_SERVER_NAME", "0.0.0.0").strip(),
            server_port=_int("GRADIO_SERVER_PORT", get("GRADIO_SERVER_PORT", "7860"), 1, 65535),
        )
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @property
    def per_call(self) -> bool:
        """Whether GPU state may be lost between calls (ZeroGPU), so LoRAs are re-applied in every call."""
        return self.gpu_mode == "per_call" or (self.gpu_mode == "auto" and self.zero_gpu)

    @property
    def loads_tiny(self) -> bool:
        """`tiny` or `tiny-sd15`: build a random-weight tiny pipeline (whether a model is tiny:
        `ModelDefaults.is_tiny`)."""
        return self.model_id in TINY_MODEL_IDS

    @property
    def pool_settings(self) -> tuple[PoolSetting, ...]:
        """The pools to serve, the default first (one pool when only MODEL_ID is set)."""
        return self.pools or (PoolSetting(self.model_id, self.base_model_id),)

    def for_pool(self, pool: PoolSetting) -> Settings:
        """These settings for one pool: its model and base in `model_id` / `base_model_id` (`pools` kept)."""
        return dataclasses.replace(self, model_id=pool.model_id, base_model_id=pool.base_model_id)

    @property
    def log_level_number(self) -> int:
        return logging.getLevelName(self.log_level)


def _pools(get: Callable[[str], str | None]) -> tuple[PoolSetting, ...]:
    models = get("MODELS")
    if models is None:
        return ()
    both = [name for name in ("MODEL_ID", "BASE_MODEL_ID") if get(name)]
    if both:
        raise SettingsError(
            f"MODELS and {' and '.join(both)} are both set; accepted: MODELS alone, or MODEL_ID "
            "(with BASE_MODEL_ID) as the one-pool shorthand"
        )
    return parse_models(models)


def _choice(name: str, raw: str, accepted: tuple[str, ...]) -> str:
    value = raw.strip()
    if value not in accepted:
        raise SettingsError(f"{name}={raw!r} is not accepted; accepted: {', '.join(accepted)}")
    return value


def _positive_bytes(name: str, raw: str) -> int:
    value = parse_bytes(name, raw)
    if value < 1:
        raise SettingsError(f"{name}={raw!r} is not accepted; accepted: a byte size of at least 1 byte, e.g. 2GiB")
    return value


def _device(raw: str) -> str:
    value = raw.strip()
    if value in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise SettingsError(f"DEVICE={raw!r} is not accepted; accepted: {', '.join(_DEVICES)}")


def _preview_vae(raw: str) -> str:
    value = raw.strip()
    if value in ("auto", "none") or _HUB_ID.match(value):
        return value
    folder = Path(value).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    raise SettingsError(
        f"PREVIEW_VAE={raw!r} is not accepted; accepted: auto, none, a Hub repo id (owner/name) "
        "or an existing folder holding an AutoencoderTiny"
    )


def _int(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise SettingsError(f"{name}={raw!r} is not accepted; accepted: an integer from {low} to {high}")
    return value


def _float(name: str, raw: str, low: float, high: float) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise SettingsError(f"{name}={raw!r} is not accepted; accepted: a number from {low} to {high}")
    return value


def _bool(name: str, raw: str) -> bool:
    key = raw.strip().lower()
    if key not in _BOOLS:
        raise SettingsError(f"{name}={raw!r} is not accepted; accepted: {', '.join(_BOOLS)}")
    return _BOOLS[key]


def _url(name: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    value = raw.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise SettingsError(
            f"{name}={raw!r} is not accepted; accepted: an http(s) URL with a host and no query, "
            "e.g. http://head-node:8000"
        )
    try:
        parts.port  # noqa: B018 -- urlsplit checks the port only when it is read
    except ValueError as e:
        raise SettingsError(f"{name}={raw!r} has a bad port; accepted: a port from 0 to 65535") from e
    return value.rstrip("/")


def _dir(name: str, raw: str | None) -> Path | None:
    if raw is None:
        return None
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise SettingsError(f"{name}={raw!r} is not an existing folder; accepted: a path to a folder")
    return path
