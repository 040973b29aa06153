"""Helpers shared by several test modules."""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch

from engine.errors import (
    AdapterLoadError,
    GatedLoraError,
    GenerationCancelledError,
    IncompatibleLoraError,
    LimitExceededError,
    LoraNotFoundError,
    SwitchboardError,
    UnsupportedLoraVariantError,
)
from engine.pools.engine import Engine
from engine.pools.pools import Pools
from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from lora_catalog.errors import AmbiguousWeightsError, PickleOnlyError
from serving.backends import Backend, blocking
from serving.backends.local import LocalBackend

# One backend per engine or pools a test builds, as a Space has one (its ZeroGPU view and worker cache with it).
_BACKENDS: weakref.WeakKeyDictionary[object, LocalBackend] = weakref.WeakKeyDictionary()


def backend_of(target: Engine | Pools | Backend) -> Backend:
    """The backend every transport would use over `target`: a `LocalBackend` over an engine alone or over pools
    (one per target, as a Space has one: its ZeroGPU view and worker cache with it); a backend is itself."""
    if not isinstance(target, Engine | Pools):
        return target
    if target not in _BACKENDS:
        _BACKENDS[target] = LocalBackend.of(target) if isinstance(target, Engine) else LocalBackend(target)
    return _BACKENDS[target]


def generate(
    target: Engine | Pools | Backend,
    request: GenerateRequest,
    *,
    cancel: threading.Event | None = None,
    **options: Any,
) -> GenerateResult:
    """`LocalBackend.generate`, the one path, waited on from the test's thread. Setting `cancel` cancels the call
    as a client going away does; once it has ended, GenerationCancelledError is raised here."""
    return blocking(_until(backend_of(target).generate(request, **options), cancel))


async def _until(operation: Coroutine[Any, Any, GenerateResult], cancel: threading.Event | None) -> GenerateResult:
    task = asyncio.ensure_future(operation)
    cancelled = False
    while not task.done():
        if cancel is not None and cancel.is_set() and not cancelled:
            task.cancel()
            cancelled = True
        await asyncio.wait({task}, timeout=0.01)
    try:
        return task.result()
    except asyncio.CancelledError as e:
        raise GenerationCancelledError("the test cancelled the request") from e


def assert_pristine(loaded, pristine) -> None:
    for name in ("unet", "text_encoder", "text_encoder_2"):
        for key, value in getattr(loaded.pipe, name).state_dict().items():
            assert torch.equal(value, pristine[f"{name}.{key}"]), f"{name}.{key} drifted"


PROMPT = "a lighthouse on a cliff"


def small(*loras: LoraSpec, seed: int = 5, steps: int = 1, prompt: str = PROMPT) -> GenerateRequest:
    """A request the tiny pipeline answers in about a tenth of a second."""
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=steps, width=64, height=64, seed=seed)


@contextmanager
def unchanged(engine, loaded, pristine) -> Iterator[None]:
    """The block must leave the served set as it was; when that set is the base, every weight bit-exact."""
    before = engine.status().applied
    yield
    assert engine.status().applied == before
    if not before:
        assert_pristine(loaded, pristine)


# role -> (error class, message fragment): what a request for that fixture repo must raise.
BAD_REPOS: dict[str, tuple[type[SwitchboardError], str]] = {
    "truncated": (AdapterLoadError, r"not a valid safetensors file: .*file truncated"),
    "lying-header": (AdapterLoadError, r"not a valid safetensors file: .*the offsets lie about the data"),
    "lying-shape": (AdapterLoadError, r"not a valid safetensors file: .*the offsets lie about the data"),
    "huge-header": (AdapterLoadError, r"declared header length 1099511627776 bytes is over the limit"),
    "nan": (AdapterLoadError, r"holds NaN or infinite values in 'unet\..*'; accepted: finite weights only"),
    "inf": (AdapterLoadError, r"holds NaN or infinite values in '.*'; accepted: finite weights only"),
    "wrong-shapes": (IncompatibleLoraError, r"factors \(640, 4\) x \(4, 640\) do not fit unet\..* of shape \(64, 64\)"),
    "unknown-keys": (IncompatibleLoraError, r"targets unet\.down_blocks\.7\..*which the served pipeline lacks"),
    "high-rank": (LimitExceededError, r"has rank 64; accepted: rank up to 32"),
    "pickle-only": (PickleOnlyError, r"only pickle weights \('pytorch_lora_weights\.bin'\).*never unpickled"),
    "ckpt-only": (PickleOnlyError, r"only pickle weights \('model\.ckpt', 'model\.pt'\).*never unpickled"),
    "several": (
        AmbiguousWeightsError,
        r"several \.safetensors files \('a\.safetensors', 'b\.safetensors'\).*weight_name",
    ),
    "gated": (GatedLoraError, r"'fixtures/gated' is gated .*only LoRAs anyone can download"),
    "private": (LoraNotFoundError, r"'fixtures/private' was not found on the Hub \(or it is private\)"),
    "sd15": (IncompatibleLoraError, r"made for stable-diffusion-v1-5/stable-diffusion-v1-5 \(sd15\).*sdxl family"),
    "flux": (IncompatibleLoraError, r"made for black-forest-labs/FLUX\.1-dev \(flux\).*sdxl family"),
    "sd15-meta": (IncompatibleLoraError, r"trained for the sd15 family; this Space serves .*sdxl"),
    "oft": (UnsupportedLoraVariantError, r"uses OFT, which the fused swap cannot apply; accepted: plain LoRA, LoCon"),
    "ia3": (UnsupportedLoraVariantError, r"uses IA3, which the fused swap cannot apply; accepted: .*LoHa, LoKr"),
    "full-diff": (UnsupportedLoraVariantError, r"uses full weight differences, which .*cannot apply; accepted: .*DoRA"),
    "lora-bias": (UnsupportedLoraVariantError, r"uses LoRA bias terms, which the fused swap cannot apply"),
}


def prime(make_engine, fixtures, **overrides: object):
    """An engine serving fixtures['peft'] at 0.7, that spec, and the image `small(spec)` gives."""
    engine = make_engine(**overrides)
    good = LoraSpec(fixtures["peft"], scale=0.7)
    image = generate(engine, small(good)).image.tobytes()
    return engine, good, image


SECRET = "hf_secret_Zq8v3KfT0pLmN2xYwR7sAbCdEfGh"

# Every logger that could see a request: ours, the Hub client and the HTTP stacks under it.
LOGGERS = ("", "engine", "lora_catalog", "huggingface_hub", "httpx", "httpx2", "httpcore", "urllib3", "tests")


def peak_rss_over(run: Callable[[], object]) -> tuple[int, BaseException | None]:
    """How far this process's resident memory (the app serves from it) rose over its idle level while `run` ran,
    sampled by a thread every few milliseconds; and what `run` raised."""
    process = psutil.Process()
    idle = process.memory_info().rss
    peak, done = idle, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            done.wait(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    raised: BaseException | None = None
    try:
        run()
    except Exception as e:
        raised = e
    finally:
        done.set()
        watcher.join()
    return peak - idle, raised


@contextmanager
def raises_caused_by(pattern: str) -> Iterator[None]:
    """A failure whose own text, or that of its cause, matches `pattern`: an unforeseen failure answers only "the
    request failed (request id ID)" (`EngineError.unforeseen`), its exception kept as the cause for the log."""
    try:
        yield
    except Exception as e:
        said = f"{e} <- {e.__cause__}" if e.__cause__ is not None else str(e)
        assert re.search(pattern, said), f"{said!r} does not match {pattern!r}"
    else:
        raise AssertionError(f"nothing was raised (expected {pattern!r})")
