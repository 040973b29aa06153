"""Ahead-of-time compiled denoisers (ZeroGPU's way): torch.export + AOTInductor, bound to the module's own weights.

One package per shape (the size presets with guidance; any other shape runs eager), exported from a real call.
No package holds the weights: each is handed the module's own parameter and buffer tensors when first called in a
process (`load_constants(..., user_managed=True)`: their pointers, not copies), and again when they moved, so every
swap shows. Not spaces' `aoti_apply`, which computes with a copy of the weights. Why: docs/internals.md.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.errors import SettingsError
from engine.pipeline.compiled import shape_key

__all__ = ["AotDenoiser", "AotPackage", "capture_calls", "compile_package", "inductor_options"]

logger = logging.getLogger(__name__)

# Kept out of every package: its constants (the weights) are bound at load time, never baked in.
_NO_BAKED_WEIGHTS = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}


@dataclass(frozen=True)
class AotPackage:
    """One shape's compiled package (picklable: it crosses into ZeroGPU's worker and back)."""

    key: Hashable
    archive: bytes
    # Constants of the exported program that are not the module's parameters or buffers, by name.
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    compile_s: float = 0.0


def inductor_options(mode: str) -> dict[str, Any]:
    """AOTInductor's options for a `COMPILE` mode; CUDA graphs are torch.compile's own, not AOTInductor's."""
    if mode == "reduce-overhead":
        raise SettingsError(
            "COMPILE=reduce-overhead records CUDA graphs, which ahead-of-time packages (ZeroGPU) do not have; "
            "accepted there: off, default, max-autotune"
        )
    if torch._inductor.config.freezing:
        raise SettingsError(
            "TORCHINDUCTOR_FREEZING=1 folds the weights into the package as constants, so a swapped LoRA would not "
            "show; accepted: TORCHINDUCTOR_FREEZING unset (or 0), or COMPILE=off"
        )
    options = {k: v for k, v in torch._inductor.list_mode_options(mode).items() if not k.startswith("triton.cuda")}
    return {**options, **_NO_BAKED_WEIGHTS}


def capture_calls(
    module: torch.nn.Module, sizes: Sequence[tuple[int, int]], run: Callable[[int, int], None]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The first call of `module` in `run(width, height)` for each size: its arguments, copied."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    seen: set[Hashable] = set()

    def keep(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        key = shape_key(args, kwargs)
        if key not in seen:
            seen.add(key)
            calls.append((_copied(args), _copied(kwargs)))

    hook = module.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        for width, height in sizes:
            run(width, height)
    finally:
        hook.remove()
    return calls


def compile_package(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str) -> AotPackage:
    """Export `module` at this call and compile it with AOTInductor into a package without its weights."""
    options = inductor_options(mode)
    started = time.perf_counter()
    # Captured inside the pipeline's inference mode; export wants ordinary tensors.
    with torch.inference_mode(False):
        args, kwargs = _copied(args), _copied(kwargs)
    with torch.no_grad():
        exported = torch.export.export(module, args, kwargs)
        archive = io.BytesIO()
        torch._inductor.aoti_compile_and_package(exported, package_path=archive, inductor_configs=options)
    own = _own_tensors(module)
    extra = {name: t.detach().cpu() for name, t in exported.constants.items() if isinstance(t, torch.Tensor)}
    elapsed = time.perf_counter() - started
    logger.info(
        "denoiser packaged ahead of time (%s) in %.1f s: %.1f MiB", mode, elapsed, len(archive.getvalue()) / 2**20
    )
    return AotPackage(
        shape_key(args, kwargs), archive.getvalue(), {k: v for k, v in extra.items() if k not in own}, elapsed
    )


class AotDenoiser:
    """The denoiser's `forward`: a package for each packaged shape, eager for any other (like `CompiledDenoiser`).

    Packages are loaded lazily in the process that calls them (ZeroGPU's worker, never its main process, which has
    no GPU) and bound to the module's tensors there. Called by one thread at a time (the engine's pipeline lock).
    """

    def __init__(self, module: torch.nn.Module, packages: Iterable[AotPackage], mode: str) -> None:
        self._module = module
        self._eager: Callable[..., Any] = module.forward
        self._packages = {p.key: p for p in packages}
        self.mode = mode
        # Per process (a forked worker loads its own): package key -> (runner, the pointers it was bound to, and
        # the package's own constants on the device, kept alive here: the runner holds their pointers only).
        self._runners: dict[tuple[int, Hashable], tuple[Any, tuple[int, ...], dict[str, torch.Tensor]]] = {}
        # The module's parameters and buffers by name, read once: walking the module per call cost 22 ms per step
        # for SDXL's UNet on 2 cores (its 1,680 tensors' addresses, checked per call, 1 ms). Moves re-point these
        # same tensor objects (`engine.pools.flat`, and spaces' ZeroGPU packing), so the addresses are read per
        # call, from this list; nothing replaces a denoiser's Parameter objects after the package is installed.
        self._tensors: dict[str, torch.Tensor] | None = None
        self.compile_s = sum(p.compile_s for p in self._packages.values())
        self.eager_calls = 0
        self.compiled_calls = 0
        self.binds = 0
        # Nothing here compiles at run time: the recompile count is always 0 (kept for the status line).
        self.recompiles = 0

    @classmethod
    def install(cls, module: torch.nn.Module, packages: Iterable[AotPackage], mode: str) -> AotDenoiser:
        existing = module.__dict__.get("forward")
        if existing is not None:
            existing.remove()
        aot = cls(module, packages, mode)
        module.forward = aot
        return aot

    def remove(self) -> None:
        if self._module.__dict__.get("forward") is self:
            del self._module.forward

    @property
    def shapes(self) -> int:
        return len(self._packages)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        return self._eager(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = shape_key(args, kwargs)
        package = self._packages.get(key)
        if package is None:
            self.eager_calls += 1
            return self._eager(*args, **kwargs)
        self.compiled_calls += 1
        return self._bound(package)(*args, **kwargs)

    def _bound(self, package: AotPackage) -> Any:
        slot = (os.getpid(), package.key)
        if self._tensors is None:
            self._tensors = _own_tensors(self._module)
        tensors = self._tensors
        pointers = tuple(t.data_ptr() for t in tensors.values())
        held = self._runners.get(slot)
        if held is not None and held[1] == pointers:
            return held[0]
        runner = held[0] if held is not None else torch._inductor.aoti_load_package(io.BytesIO(package.archive))
        device = next(iter(tensors.values())).device
        extra = {name: t.to(device) for name, t in package.extra.items()}
        constants = {name: tensors[name] if name in tensors else extra[name] for name in runner.get_constant_fqns()}
        runner.load_constants(constants, check_full_update=True, user_managed=True)
        self._runners[slot] = (runner, pointers, extra)
        self.binds += 1
        logger.info(
            "ahead-of-time denoiser bound to the module's %d weight tensors (process %d)", len(tensors), slot[0]
        )
        return runner


def _own_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers by name, as the package names its constants."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_copied(v) for v in value)
    return value
