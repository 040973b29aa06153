"""Text encoders the memory plan leaves in host RAM: computed on the GPU, their weights streamed in per call, and
their outputs for recent prompts kept.

On CUDA, diffusers' group offloading streams their weights in leaf by leaf on a side stream; on the CPU, hooks
move inputs and outputs only. Each such encoder keeps its outputs for recent inputs in host RAM, bounded in bytes
(`CachedEncoder`); only encoders no LoRA and no pivotal token changes are cached, so an output depends on its
inputs alone. The cost that decides it: docs/internals.md, "engine/pipeline/encoders.py".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from accelerate.utils import send_to_device
from cachetools import LRUCache

__all__ = ["ENCODER_CACHE_BYTES", "CachedEncoder", "run_from_host_ram"]

logger = logging.getLogger(__name__)

# Outputs kept per encoder, in host RAM: FLUX's T5 output for one 512-token prompt is 4 MiB in bf16, so about 16
# prompts with their negatives.
ENCODER_CACHE_BYTES = 128 * 2**20


class _Uncacheable(Exception):
    """An input or output this cache cannot key or copy (it is then computed, not kept)."""


def run_from_host_ram(module: torch.nn.Module, device: torch.device, *, cache_bytes: int | None) -> None:
    """Make `module`, whose weights stay in host RAM, compute on `device` (streamed there per call on CUDA), and
    keep its recent outputs when `cache_bytes` is given (None: a LoRA may change it, so nothing is kept)."""
    if device.type == "cuda":
        # Imported here: diffusers' hooks are needed only where a GPU runs a host-RAM encoder.
        from diffusers.hooks import apply_group_offloading

        apply_group_offloading(
            module,
            onload_device=device,
            offload_device=torch.device("cpu"),
            offload_type="leaf_level",
            use_stream=True,
            non_blocking=True,
        )
    else:
        _compute_on_host(module, device)
    if cache_bytes is not None:
        CachedEncoder.install(module, cache_bytes)


def _compute_on_host(module: torch.nn.Module, device: torch.device) -> None:
    """Inputs brought to host RAM, outputs handed back on `device` (FluxPipeline sends T5 the token ids on its
    execution device); accelerate's `send_to_device` moves nested arguments and outputs (a ModelOutput too)."""
    host = torch.device("cpu")

    def inputs(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return send_to_device(args, host), send_to_device(kwargs, host)

    def outputs(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        return send_to_device(output, device)

    module.register_forward_pre_hook(inputs, with_kwargs=True)
    module.register_forward_hook(outputs, with_kwargs=True)


class CachedEncoder:
    """An encoder's `forward` that returns a copy of its output for inputs it saw recently (LRU, bounded in bytes).

    Installed as the module's own `forward`, around whatever hooks stream its weights, so a hit moves no weights.
    Outputs are kept in host RAM and handed back as new tensors on the device the inputs came on.
    """

    def __init__(self, module: torch.nn.Module, max_bytes: int) -> None:
        self._forward: Callable[..., Any] = module.forward
        self._cache: LRUCache[Hashable, tuple[Any, int]] = LRUCache(maxsize=max_bytes, getsizeof=lambda v: v[1])
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @classmethod
    def install(cls, module: torch.nn.Module, max_bytes: int) -> CachedEncoder:
        existing = module.__dict__.get("forward")
        if isinstance(existing, CachedEncoder):
            return existing
        cached = cls(module, max_bytes)
        module.forward = cached
        return cached

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            key = _key((args, kwargs))
        except _Uncacheable:
            return self._forward(*args, **kwargs)
        device = _device_of((args, kwargs))
        with self._lock:
            held = self._cache.get(key)
        if held is not None:
            self.hits += 1
            return _copied(held[0], device)
        self.misses += 1
        output = self._forward(*args, **kwargs)
        try:
            kept = _copied(output, torch.device("cpu"))
        except _Uncacheable:
            return output
        size = _nbytes(kept)
        if size <= self._cache.maxsize:
            with self._lock:
                self._cache[key] = (kept, size)
        return output


def _key(value: Any) -> Hashable:
    """What the encoder's output depends on besides its weights: every tensor's values, every flag."""
    if isinstance(value, torch.Tensor):
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return ("tensor", str(value.dtype), tuple(value.shape), raw.numpy().tobytes())
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, Mapping):
        return ("mapping", tuple((k, _key(v)) for k, v in sorted(value.items())))
    raise _Uncacheable(type(value).__name__)


def _device_of(value: Any) -> torch.device:
    """The device of the first tensor among the inputs (the CPU when there is none)."""
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, tuple | list) else ()
    for item in items:
        if isinstance(item, torch.Tensor | tuple | list | Mapping):
            found = _device_of(item)
            if found.type != "cpu":
                return found
    return torch.device("cpu")


def _copied(value: Any, device: torch.device) -> Any:
    """A copy of an output (tensors, tuples, lists, a ModelOutput or dict) with every tensor new, on `device`."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return type(value)(_copied(v, device) for v in value)
    if isinstance(value, Mapping):
        # A transformers ModelOutput is built from its fields by keyword, like a dict.
        return type(value)(**{k: _copied(v, device) for k, v in value.items()})
    raise _Uncacheable(type(value).__name__)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, tuple | list):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    return 0
