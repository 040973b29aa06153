"""One frozen `Settings`, built once from the environment.

This is the only module that reads environment variables (Gradio reads its own `GRADIO_*` and huggingface_hub
its own `HF_*` ones). Each field is declared once: its type, default, range and the variable that sets it
(`Env`). `from_env` turns any refusal into one SettingsError naming the variable, its value and what is
accepted; a bad value stops start-up. Why not pydantic-settings: docs/internals.md, "engine/settings.py".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from engine import settings_values as sv
from engine.errors import SettingsError
from engine.images import DEFAULT_MAX_INPUT_PIXELS, DEFAULT_MAX_REQUEST_PIXELS, MOST_IMAGES
from engine.models import (
    DEFAULT_MODEL_ID,
    DEFAULT_POOLS,
    DEMO_LATER_POOLS,
    DEMO_POOLS,
    HUB_ID,
    TINY_MODEL_ID,
    TINY_MODEL_IDS,
    PoolSetting,
    Quantize,
    parse_models,
)

__all__ = [
    "CIVITAI_STORAGE_HOSTS",
    "DEFAULT_MODEL_ID",
    "DEFAULT_POOLS",
    "DEMO_LATER_POOLS",
    "DEMO_POOLS",
    "TINY_MODEL_ID",
    "TINY_MODEL_IDS",
    "PoolSetting",
    "Settings",
    "parse_bytes",
    "parse_models",
]


@dataclass(frozen=True)
class Env:
    """Field metadata: the environment variable that sets the field."""

    var: str


_Stripped = BeforeValidator(sv.strip)
# Civitai's storage hosts its download endpoint redirects to: `b2.civitai.com` (signed out) and its Cloudflare R2
# delivery worker (signed in), as seen in the wild (ComfyUI Civitai clients allow the same two).
CIVITAI_STORAGE_HOSTS = (
    "*.civitai.com",
    "civitai-delivery-worker-prod.5ac0637cfd0766c97916cefa3764fbdf.r2.cloudflarestorage.com",
)
_Bytes = Annotated[int, BeforeValidator(sv.byte_size)]
_Bool = Annotated[bool, BeforeValidator(sv.boolean)]


class Settings(BaseModel):
    """Everything configurable, with the defaults a Space on an A10G wants."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    # MODEL_ID, BASE_MODEL_ID and MODELS depend on each other: `from_env` reads them.
    model_id: Annotated[str, AfterValidator(sv.model_id), Env("MODEL_ID")] = DEFAULT_MODEL_ID
    model_id_explicit: bool = False
    base_model_id: Annotated[str, AfterValidator(sv.hub_id), Env("BASE_MODEL_ID")] = DEFAULT_MODEL_ID
    # Empty: one pool, `model_id` checked against `base_model_id` (the MODEL_ID shorthand).
    pools: tuple[PoolSetting, ...] = ()
    pool_offload: Annotated[_Bool, Env("POOL_OFFLOAD")] = True
    device: Annotated[str, AfterValidator(sv.device), Env("DEVICE")] = "auto"
    dtype: Annotated[Literal["auto", "float32", "float16", "bfloat16"], _Stripped, Env("DTYPE")] = "auto"
    vae_id: Annotated[str | None, Env("VAE_ID")] = None
    # torch.compile of each pool's denoiser at start-up (engine.pipeline.compiled); `reduce-overhead` adds CUDA
    # graphs. Off until measured on a GPU.
    compile: Annotated[Literal["off", "default", "max-autotune", "reduce-overhead"], _Stripped, Env("COMPILE")] = "off"
    # Where inductor keeps its caches (compiled graphs, kernels, autotuning), so a restart reuses them; unset:
    # torch's own choice (TORCHINDUCTOR_CACHE_DIR, else a folder under /tmp, gone when a Space is rebuilt).
    compile_cache_dir: Annotated[Path | None, Env("COMPILE_CACHE_DIR")] = None
    gpu_mode: Annotated[Literal["auto", "persistent", "per_call"], _Stripped, Env("GPU_MODE")] = "auto"
    # Weight storage of each pool's denoiser: `fp8` (e4m3, per-row scales, bf16 compute; LoRAs run as low-rank
    # branches beside it, never fused) or `int4` (4-bit codes, group scales and zeros; the same branches) for every
    # pool, `off` for none, `auto` only where the memory plan needs it
    # to fit (engine.pools.plan).
    quantize: Annotated[Quantize, BeforeValidator(sv.lower), Env("QUANTIZE")] = "auto"
    # The rank a quantized pool's LoRA branch buffers are sized to, zero-padded (diffusers hotswap's
    # `target_rank`); a LoRA over it is refused there. Memory: docs/configuration.md, QUANTIZE.
    lora_max_rank: Annotated[int, Field(ge=1, le=1024), Env("LORA_MAX_RANK")] = 128
    # The one folder local GGUF denoisers (`MODELS` items `MODEL@/path.gguf`) may be read from; None: none may.
    gguf_dir: Annotated[Path | None, Env("GGUF_DIR")] = None
    # This pool's GGUF denoiser (its MODELS item's `@GGUF`; set per pool by `for_pool`); None: the model's own.
    gguf: str | None = None
    # This pool's second GGUF file (`@GGUF@GGUF_2`: Wan 2.2 A14B's low-noise `transformer_2`); None: none.
    gguf_2: str | None = None
    # The input values sharing one scale and zero in an int4 denoiser (QUANTIZE=int4; engine.weights.int4): the
    # sizes torchao's int4 CPU kernel takes; a linear whose width it does not divide stays in the compute dtype.
    int4_group_size: Annotated[Literal[32, 64, 128], BeforeValidator(sv.integer), Env("INT4_GROUP_SIZE")] = 128
    pristine_store: Annotated[Literal["auto", "device", "cpu"], _Stripped, Env("PRISTINE_STORE")] = "auto"
    host_cache_bytes: Annotated[_Bytes, Env("HOST_CACHE_BYTES")] = 4 * 2**30
    device_cache_bytes: Annotated[_Bytes, Env("DEVICE_CACHE_BYTES")] = 2 * 2**30
    # None (`auto`): each pool's own touchable weights, so no LoRA is refused for how much it adapts (a FLUX LoRA
    # from ai-toolkit touches nearly all of the transformer's 22 GiB); the memory plan places the copies.
    pristine_bytes: Annotated[_Bytes | None, BeforeValidator(sv.auto_none), Env("PRISTINE_BYTES")] = None
    # None (`auto`): the machine's RAM or its cgroup's limit, less a margin for the process itself
    # (engine.hostmem); the memory plan fits everything it places in host RAM within it.
    host_ram_bytes: Annotated[_Bytes | None, BeforeValidator(sv.auto_none), Env("HOST_RAM_BYTES")] = None
    disk_cache_bytes: Annotated[_Bytes, Env("DISK_CACHE_BYTES")] = 20 * 2**30
    max_adapter_bytes: Annotated[_Bytes, Env("MAX_ADAPTER_BYTES")] = 1536 * 2**20
    max_rank: Annotated[int, Field(ge=1, le=4096), Env("MAX_RANK")] = 256
    max_loras: Annotated[int, Field(ge=1, le=8), Env("MAX_LORAS")] = 4
    # The segments one LoRA's schedule may have (`engine.schedules`): each boundary is one exact swap in the run.
    max_schedule_segments: Annotated[int, Field(ge=1, le=64), Env("MAX_SCHEDULE_SEGMENTS")] = 8
    max_steps: Annotated[int, Field(ge=1, le=500), Env("MAX_STEPS")] = 60
    max_side: Annotated[int, Field(ge=64, le=4096), Env("MAX_SIDE")] = 1536
    max_prompt_chars: Annotated[int, Field(ge=1, le=100_000), Env("MAX_PROMPT_CHARS")] = 2000
    # A request's input image (and mask), judged from the file's header before it is decoded: 4 times the largest
    # size preset's pixels (Qwen-Image's 1328 x 1328: tests/engine/test_images.py holds it to the families' presets).
    max_input_pixels: Annotated[int, Field(ge=64 * 64, le=2**28), Env("MAX_INPUT_PIXELS")] = DEFAULT_MAX_INPUT_PIXELS
    # All of a request's images (its image, mask and further references) together, from their headers, before any
    # is decoded: the largest pool's count (FLUX.2 [dev]'s 6) of 4.7 MP photos; 85 MB of RGB once decoded.
    max_request_pixels: Annotated[int, Field(ge=64 * 64, le=2**30), Env("MAX_REQUEST_PIXELS")] = (
        DEFAULT_MAX_REQUEST_PIXELS
    )
    # The images one request may bring (its image and its further references); None (`auto`): the largest pool
    # limit, each pool's own (`ModelDefaults.max_reference_images`), which a request never passes anyway.
    max_reference_images: Annotated[
        Annotated[int, Field(ge=1, le=MOST_IMAGES)] | None, BeforeValidator(sv.auto_none), Env("MAX_REFERENCE_IMAGES")
    ] = None
    # A video's most frames (4k+1: 81 is Wan's 5 s at 16 fps); a pool's own maximum may be lower.
    max_video_frames: Annotated[int, Field(ge=5, le=1001), Env("MAX_VIDEO_FRAMES")] = 81
    # A POST body: room for such an image and its mask in base64 (a noisy 2048 x 2048 PNG is about 12 MiB).
    max_body_bytes: Annotated[_Bytes, Field(ge=64 * 1024), Env("MAX_BODY_BYTES")] = 32 * 2**20
    max_queue: Annotated[int, Field(ge=1, le=10_000), Env("MAX_QUEUE")] = 16
    affinity_max_skip: Annotated[int, Field(ge=0, le=1000), Env("AFFINITY_MAX_SKIP")] = 3
    prepare_workers: Annotated[int, Field(ge=1, le=64), Env("PREPARE_WORKERS")] = 2
    prepare_inflight_bytes: Annotated[_Bytes, AfterValidator(sv.at_least_one_byte), Env("PREPARE_INFLIGHT_BYTES")] = (
        2 * 2**30
    )
    scheduler: Annotated[Literal["affinity", "fifo_inline"], _Stripped, Env("SCHEDULER")] = "affinity"
    # The device shared step by step between pools' runs (engine.pipeline.stepshare): `auto` is `step` on a
    # persistent CUDA device, the whole-run lock (`run`) on ZeroGPU (each call has its own GPU) and off on the CPU;
    # a run that has waited longer than STEP_SHARING_STARVE_STEPS of its own steps goes next.
    device_sharing: Annotated[Literal["auto", "step", "run", "off"], _Stripped, Env("DEVICE_SHARING")] = "auto"
    step_sharing_starve_steps: Annotated[float, Field(ge=0.0, le=10_000.0), Env("STEP_SHARING_STARVE_STEPS")] = 8.0
    # Live previews while denoising (off for `POST /`, which answers with the final image only).
    previews: Annotated[_Bool, Env("PREVIEWS")] = True
    preview_vae: Annotated[str, AfterValidator(sv.preview_vae), Env("PREVIEW_VAE")] = "auto"
    preview_every: Annotated[int, Field(ge=1, le=500), Env("PREVIEW_EVERY")] = 2
    # Comparison grids: cells per grid and denoising steps over all its cells.
    max_compare_cells: Annotated[int, Field(ge=1, le=16), Env("MAX_COMPARE_CELLS")] = 6
    max_compare_steps: Annotated[int, Field(ge=1, le=10_000), Env("MAX_COMPARE_STEPS")] = 150
    local_lora_dir: Annotated[Path | None, AfterValidator(sv.folder), Env("LOCAL_LORA_DIR")] = None
    catalog_snapshot: Annotated[Path | None, Env("CATALOG_SNAPSHOT")] = None
    catalog_refresh: Annotated[_Bool, Env("CATALOG_REFRESH")] = True
    hub_timeout_s: Annotated[float, Field(ge=0.1, le=600.0), Env("HUB_TIMEOUT_S")] = 10.0
    hf_token: Annotated[str | None, Field(repr=False), Env("HF_TOKEN")] = None
    # Civitai (lora_catalog.civitai): its API and downloads, at one endpoint, under an NSFW ceiling; downloads
    # follow redirects to the endpoint's host and these hosts only; the token goes to the endpoint's host only.
    civitai: Annotated[_Bool, Env("CIVITAI")] = True
    civitai_endpoint: Annotated[str, AfterValidator(sv.url), Env("CIVITAI_ENDPOINT")] = "https://civitai.com"
    civitai_token: Annotated[str | None, Field(repr=False), Env("CIVITAI_TOKEN")] = None
    civitai_max_nsfw_level: Annotated[
        Literal["PG", "PG13", "R", "X", "XXX"], BeforeValidator(sv.nsfw_level), Env("CIVITAI_MAX_NSFW_LEVEL")
    ] = "PG13"
    civitai_allowed_hosts: Annotated[tuple[str, ...], BeforeValidator(sv.hosts), Env("CIVITAI_ALLOWED_HOSTS")] = (
        CIVITAI_STORAGE_HOSTS
    )
    # Where Civitai files are kept (None: `$HF_HOME/civitai`); DISK_CACHE_BYTES covers them with the Hub's LoRAs.
    civitai_cache_dir: Annotated[Path | None, Env("CIVITAI_CACHE_DIR")] = None
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(sv.upper), Env("LOG_LEVEL")] = (
        "INFO"
    )
    zero_gpu: Annotated[_Bool, Env("SPACES_ZERO_GPU")] = False
    # GET /metrics (Prometheus text); off by default because a public Space would publish it to everyone.
    metrics: Annotated[_Bool, Env("METRICS")] = False
    # Each image carries its recipe (A1111's `parameters`: prompt, settings, LoRAs and their hashes).
    recipes: Annotated[_Bool, Env("RECIPES")] = True
    # With a URL, the Space is a front end: generation goes to that Ray Serve cluster (serving.cluster.app).
    backend_url: Annotated[str | None, AfterValidator(sv.url), Env("BACKEND_URL")] = None
    backend_timeout_s: Annotated[float, Field(ge=1.0, le=86_400.0), Env("BACKEND_TIMEOUT_S")] = 600.0
    # The cluster's shape (serving.cluster.app): replicas per pool, requests a replica takes at once, adapter
    # sets each replica holds (Serve's multiplexed LRU, which the engine's prepared-adapter cache follows).
    cluster_replicas: Annotated[int, Field(ge=1, le=1024), Env("CLUSTER_REPLICAS")] = 1
    cluster_max_ongoing: Annotated[int, Field(ge=1, le=64), Env("CLUSTER_MAX_ONGOING")] = 1
    cluster_adapter_sets: Annotated[int, Field(ge=1, le=4096), Env("CLUSTER_ADAPTER_SETS")] = 16
    cluster_gpus_per_replica: Annotated[float, Field(ge=0.0, le=8.0), Env("CLUSTER_GPUS_PER_REPLICA")] = 1.0
    # Where a pool's requests go (serving/cluster/policy.py): `ours` (the fleet model's least_finish) or Ray
    # Serve's own multiplexed router; replicas report what `ours` reads every CLUSTER_STATS_PERIOD_S seconds.
    cluster_router: Annotated[Literal["ours", "ray_multiplexed"], _Stripped, Env("CLUSTER_ROUTER")] = "ours"
    cluster_stats_period_s: Annotated[float, Field(ge=0.05, le=60.0), Env("CLUSTER_STATS_PERIOD_S")] = 1.0
    # torch threads per replica; 0: one per core of the node, as torch outside Ray (Ray gives an actor that asks
    # for no CPUs one thread, which makes a CPU replica slow and its floats differ from a process with more).
    cluster_cpu_threads: Annotated[int, Field(ge=0, le=512), Env("CLUSTER_CPU_THREADS")] = 0
    # Autoscaling by queue depth (serving/cluster/shape.py): 0 keeps CLUSTER_REPLICAS per pool; otherwise each
    # pool runs CLUSTER_REPLICAS to this many replicas (0 to it for the pools named in CLUSTER_SCALE_TO_ZERO),
    # aiming at CLUSTER_TARGET_ONGOING requests per replica.
    cluster_max_replicas: Annotated[int, Field(ge=0, le=1024), Env("CLUSTER_MAX_REPLICAS")] = 0
    cluster_target_ongoing: Annotated[float, Field(ge=0.01, le=64.0), Env("CLUSTER_TARGET_ONGOING")] = 0.5
    cluster_scale_to_zero: Annotated[tuple[str, ...], BeforeValidator(sv.names), Env("CLUSTER_SCALE_TO_ZERO")] = ()
    # Each replica downloads into its own Hub-cache folder, as replicas on separate machines would (for measuring
    # a cluster on one machine: bench.fleet --real); off, replicas on one node share its Hub cache.
    cluster_own_hub_cache: Annotated[_Bool, Env("CLUSTER_OWN_HUB_CACHE")] = False
    # Seconds each replica's pipeline call waits instead of denoising (serving/cluster/standin.py), for measuring
    # the cluster on shared CPUs as the fleet model's one GPU per replica (bench.fleet --real); 0: real inference.
    cluster_standin_gpu_s: Annotated[float, Field(ge=0.0, le=3600.0), Env("CLUSTER_STANDIN_GPU_S")] = 0.0
    # A video pool's stand-in (the same file): seconds per denoising step (split evenly over the step's pieces:
    # its guidance passes through its transformer's blocks, as the engine shares them) and per latent frame of its
    # VAE decode; `bench.fleet --real` sets them from `bench.mixed`'s Wan table scaled as the image's wait.
    # With a step of 0 a video's call waits CLUSTER_STANDIN_GPU_S over its steps, as an image's; a chunk of 0, none.
    cluster_standin_video_step_s: Annotated[float, Field(ge=0.0, le=3600.0), Env("CLUSTER_STANDIN_VIDEO_STEP_S")] = 0.0
    cluster_standin_video_chunk_s: Annotated[float, Field(ge=0.0, le=3600.0), Env("CLUSTER_STANDIN_VIDEO_CHUNK_S")] = (
        0.0
    )
    # Gradio's files (results, uploads, in GRADIO_TEMP_DIR) older than this many seconds are deleted (Gradio's
    # `delete_cache`, checked every `delete_cache`'s first figure of seconds), so a long-running Space's disk does
    # not fill with them; 0: kept until the server stops.
    temp_files_max_age_s: Annotated[int, Field(ge=0, le=30 * 86_400), Env("TEMP_FILES_MAX_AGE_S")] = 7200
    # Gradio's own variables, read here so nothing else reads the environment; a Space sets both.
    server_name: Annotated[str, Env("GRADIO_SERVER_NAME")] = "0.0.0.0"
    server_port: Annotated[int, Field(ge=1, le=65535), Env("GRADIO_SERVER_PORT")] = 7860

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from `env` (pass `os.environ`); unknown keys are ignored, and so are empty values."""
        given = {k: v for k, v in env.items() if v != ""}
        raw = {field: given[var] for field, var in _ENV_VARS.items() if var in given}
        values: dict[str, Any] = dict(raw)
        if "MODELS" in given:
            both = [name for name in ("MODEL_ID", "BASE_MODEL_ID") if name in given]
            if both:
                raise SettingsError(
                    f"MODELS and {' and '.join(both)} are both set; accepted: MODELS alone, or MODEL_ID "
                    "(with BASE_MODEL_ID) as the one-pool shorthand"
                )
            pools = parse_models(given["MODELS"])
            first = pools[0]
            values.update(pools=pools, model_id=first.model_id, base_model_id=first.base_model_id, gguf=first.gguf)
            values["gguf_2"] = first.gguf_2
            values["model_id_explicit"] = True
        else:
            model_id = raw.get("model_id", cls.model_fields["model_id"].default).strip()
            values["model_id_explicit"] = "model_id" in raw
            values.setdefault("base_model_id", _default_base(model_id))
        try:
            return cls.model_validate(values, context={sv.FROM_ENV: True})
        except ValidationError as e:
            raise _settings_error(e, raw) from None

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, validated like the constructor's arguments."""
        try:
            return self.model_validate({**dict(self), **changes})
        except ValidationError as e:
            raise _settings_error(e, {}) from None

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
        """These settings for one pool: its model and base in `model_id` / `base_model_id`, its own QUANTIZE where
        its MODELS item names one (`pools` kept)."""
        quantize = pool.quantize or self.quantize
        return self.replace(
            model_id=pool.model_id,
            base_model_id=pool.base_model_id,
            quantize=quantize,
            gguf=pool.gguf,
            gguf_2=pool.gguf_2,
        )

    @property
    def delete_cache(self) -> tuple[int, int] | None:
        """Gradio's `delete_cache` (how often it looks, in seconds; the age a file is deleted at), from
        TEMP_FILES_MAX_AGE_S: it looks every half of the age, at most every 10 minutes, so a file outlives its age
        by at most that; None (never) for 0."""
        age = self.temp_files_max_age_s
        return (min(max(1, age // 2), 600), age) if age else None

    @property
    def log_level_number(self) -> int:
        return logging.getLevelName(self.log_level)


# Field name -> the variable that sets it.
_ENV_VARS = {
    name: meta.var for name, info in Settings.model_fields.items() for meta in info.metadata if isinstance(meta, Env)
}


def parse_bytes(name: str, raw: str) -> int:
    """Parse a byte size such as `4GiB`, `512MB` or `1048576`; SettingsError names `name` when it is not one."""
    try:
        return sv.bytes_of(raw)
    except sv.Refused as e:
        raise SettingsError(f"{name}={raw!r} {e.problem}; accepted: {e.accepted}") from None


def _default_base(model_id: str) -> str:
    """The base a MODEL_ID's LoRAs are checked against when BASE_MODEL_ID is not set."""
    if model_id in TINY_MODEL_IDS:
        return TINY_MODEL_IDS[model_id]
    return model_id if HUB_ID.match(model_id) and not Path(model_id).exists() else DEFAULT_MODEL_ID


def _settings_error(error: ValidationError, raw: Mapping[str, str]) -> SettingsError:
    """pydantic's first refusal as the variable (or field), its value and what is accepted."""
    detail = error.errors()[0]
    field = str(detail["loc"][0]) if detail["loc"] else ""
    info = Settings.model_fields.get(field)
    name = _ENV_VARS.get(field, field) if field in raw else field
    value = raw.get(field, detail["input"])
    cause = detail.get("ctx", {}).get("error")
    if isinstance(cause, SettingsError):
        return cause
    if isinstance(cause, sv.Refused):
        problem, accepted = cause.problem, cause.accepted
    else:
        problem, accepted = "is not accepted", _accepted(info, detail)
    return SettingsError(f"{name}={value!r} {problem}; accepted: {accepted}")


def _accepted(info: FieldInfo | None, detail: ErrorDetails) -> str:
    """What a field accepts, from its declaration: its choices, or its type and range."""
    if info is None:
        return f"the fields of Settings ({detail['msg']})"
    if get_origin(info.annotation) is Literal:
        return ", ".join(str(choice) for choice in get_args(info.annotation))
    low = next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in info.metadata if isinstance(m, annotated_types.Le)), None)
    kinds: dict[object, str] = {int: "an integer", float: "a number", bool: "a boolean"}
    kind = kinds.get(info.annotation, detail["msg"])
    return f"{kind} from {low} to {high}" if low is not None and high is not None else str(kind)
