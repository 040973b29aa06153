"""Compiled denoisers that never recompile for a swap (`COMPILE`): torch.compile once per shape, at start-up.

Only the family's declared denoiser is compiled; the text encoders stay eager. Its weights are graph inputs, never
constants (freezing is refused), and the swap writes into those same tensors, so no swap recompiles or re-captures.
Shapes are static: each size preset with guidance is compiled inside the warm-up, any other shape runs eager. CUDA-
graph calls are serialised process-wide with their outputs copied out; a pool that takes turns on the device is
compiled without CUDA graphs (each move would record its graphs again, and torch keeps the old ones).
`COMPILE_CACHE_DIR` is inductor's cache folder. Why each of these: docs/internals.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch.utils._pytree import tree_map_only

from engine.errors import SettingsError

__all__ = [
    "CompileReport",
    "CompiledDenoiser",
    "check_compilable",
    "compile_denoiser",
    "configure_caches",
    "dynamo_compiles",
    "shape_key",
]

logger = logging.getLogger(__name__)

# What `COMPILE` accepts besides `off`: torch.compile's modes.
MODES = ("default", "max-autotune", "reduce-overhead")
# Distinct eager shapes logged at INFO (each is counted; only the first few are named in the log).
_LOGGED_EAGER_SHAPES = 32
# Every CUDA-graph denoiser call in the process, whichever pool's: they share the start-up thread's graph tree.
_CUDAGRAPH_CALLS = threading.Lock()


@dataclass(frozen=True)
class CompileReport:
    """What a pool's compile did at start-up: the mode, the shapes compiled, the graphs dynamo made, the time."""

    mode: str
    backend: str
    sizes: tuple[tuple[int, int], ...]
    graphs: int
    compile_s: float


def dynamo_compiles() -> int:
    """Frames dynamo has compiled in this process (a recompile is one more): its own counter."""
    return int(counters["frames"]["total"])


def configure_caches(cache_dir: Path | None) -> None:
    """Point inductor's on-disk caches at `cache_dir` (None: torch's own choice) before anything compiles.

    Inductor reads its folder from TORCHINDUCTOR_CACHE_DIR at each use and has no other setting for it, so the
    variable is written here, once, from the one Settings object.
    """
    if cache_dir is None:
        return
    folder = cache_dir.expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    logger.info("inductor caches in %s", folder)


def check_compilable(mode: str, device: torch.device) -> None:
    """Refuse what would compile weights in as constants, or a mode this device cannot run."""
    if mode not in MODES:
        raise SettingsError(f"COMPILE={mode!r} is not a compile mode; accepted: off, {', '.join(MODES)}")
    if torch._inductor.config.freezing:
        raise SettingsError(
            "TORCHINDUCTOR_FREEZING=1 folds the weights into the compiled graph as constants, so a swapped LoRA "
            f"would not show in COMPILE={mode!r}'s images; accepted: TORCHINDUCTOR_FREEZING unset (or 0), "
            "or COMPILE=off"
        )
    if mode == "reduce-overhead" and device.type != "cuda":
        raise SettingsError(
            f"COMPILE=reduce-overhead records CUDA graphs, and the device is {device}; accepted here: off, default, "
            "max-autotune"
        )


def shape_key(args: Sequence[object], kwargs: dict[str, object]) -> Hashable:
    """What a call's graph depends on: every tensor's shape, dtype and device, and the other arguments' values."""
    return (_key(tuple(args)), _key(kwargs))


def _key(value: object) -> Hashable:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if value is None or isinstance(value, bool | str):
        return value
    return type(value).__name__


class CompiledDenoiser:
    """The denoiser's `forward`, compiled for the shapes seen while `learning`, eager for any other.

    Installed as the module's own `forward` (the module object, its Parameters and its name in the pipeline all
    stay, so the swap's target table and the pools' residency are unchanged). Called by one thread at a time
    (the engine's pipeline lock), like the swap.
    """

    def __init__(
        self, module: torch.nn.Module, mode: str, *, backend: str = "inductor", cudagraphs: bool = True
    ) -> None:
        self._module = module
        self._eager: Callable[..., Any] = module.forward
        self.mode, self.backend = mode, backend
        options = torch._inductor.list_mode_options(mode) if backend == "inductor" else {}
        # CUDA graphs (reduce-overhead, and max-autotune on a GPU) reuse their output memory each step.
        self.cudagraphs = bool(options.get("triton.cudagraphs")) and cudagraphs
        self._cudagraphs = self.cudagraphs and _on_cuda(module)
        if backend != "inductor":
            self._compiled = torch.compile(self._eager, backend=backend, dynamic=False)
        elif self.cudagraphs or not options.get("triton.cudagraphs"):
            self._compiled = torch.compile(self._eager, backend=backend, mode=mode, dynamic=False)
        else:
            # The mode's own options less its CUDA graphs (torch.compile takes a mode or options, not both).
            options = {**options, "triton.cudagraphs": False}
            self._compiled = torch.compile(self._eager, backend=backend, options=options, dynamic=False)
        self._shapes: set[Hashable] = set()
        self._learning = False
        self._logged: set[Hashable] = set()
        self.recompiles = 0
        self.eager_calls = 0
        self.compiled_calls = 0
        self.report: CompileReport | None = None

    @classmethod
    def install(
        cls, module: torch.nn.Module, mode: str, *, backend: str = "inductor", cudagraphs: bool = True
    ) -> CompiledDenoiser:
        """Compile `module`'s forward in place (a module already compiled keeps its `CompiledDenoiser`)."""
        existing = module.__dict__.get("forward")
        if isinstance(existing, CompiledDenoiser):
            return existing
        compiled = cls(module, mode, backend=backend, cudagraphs=cudagraphs)
        module.forward = compiled
        return compiled

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """The module's own forward, uncompiled (what tests and benchmarks compare the compiled one with)."""
        return self._eager(*args, **kwargs)

    def remove(self) -> None:
        """The module's own forward back (tests and benchmarks compare against eager on one module)."""
        if self._module.__dict__.get("forward") is self:
            del self._module.forward

    @property
    def compile_s(self) -> float:
        """Seconds the start-up compile took (0 before it ran)."""
        return self.report.compile_s if self.report is not None else 0.0

    @property
    def shapes(self) -> int:
        """Shapes compiled (calls of these shapes run the compiled graphs)."""
        return len(self._shapes)

    @contextmanager
    def learning(self) -> Iterator[None]:
        """Inside the block (the warm-up), every call's shape is compiled and remembered."""
        # The warm-up compiles one graph per shape on the one forward: dynamo's default limit (8 graphs per
        # function, counting every pool of the same class) must not turn a preset eager.
        limit = max(torch._dynamo.config.recompile_limit, 1024)
        with torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=limit):
            self._learning = True
            try:
                yield
            finally:
                self._learning = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = shape_key(args, kwargs)
        if not self._learning and key not in self._shapes:
            self.eager_calls += 1
            if key not in self._logged and len(self._logged) < _LOGGED_EAGER_SHAPES:
                self._logged.add(key)
                logger.info("denoiser: a shape not compiled at start-up runs eager: %s", _describe(args, kwargs))
            return self._eager(*args, **kwargs)
        before = dynamo_compiles()
        out = self._run_compiled(args, kwargs)
        if self._learning:
            self._shapes.add(key)
        elif dynamo_compiles() != before:
            self.recompiles += 1
            logger.warning("denoiser recompiled for a call of a compiled shape: %s", _describe(args, kwargs))
        else:
            self.compiled_calls += 1
        return out

    def _run_compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._cudagraphs:
            return self._compiled(*args, **kwargs)
        with _CUDAGRAPH_CALLS:
            # Each denoising step is a new iteration: the previous step's outputs were already copied out.
            torch.compiler.cudagraph_mark_step_begin()
            # The outputs live in the graphs' memory pool, which the next replay (of any pool) overwrites.
            return tree_map_only(torch.Tensor, torch.clone, self._compiled(*args, **kwargs))


def compile_denoiser(
    module: torch.nn.Module,
    mode: str,
    sizes: Sequence[tuple[int, int]],
    run: Callable[[int, int], None],
    *,
    backend: str = "inductor",
    cudagraphs: bool = True,
) -> CompiledDenoiser:
    """Compile `module` for each (width, height) in `sizes`: `run(width, height)` runs the pipeline once at it.

    `cudagraphs=False` drops the mode's CUDA graphs (a pool that takes turns on the device: `engine.pools.pools`).
    """
    compiled = CompiledDenoiser.install(module, mode, backend=backend, cudagraphs=cudagraphs)
    started, before = time.perf_counter(), dynamo_compiles()
    with compiled.learning():
        for width, height in sizes:
            run(width, height)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    compiled.report = CompileReport(mode, backend, tuple(sizes), dynamo_compiles() - before, elapsed)
    logger.info(
        "denoiser compiled (%s, %s): %d shapes, %d graphs in %.1f s",
        mode,
        backend,
        compiled.shapes,
        compiled.report.graphs,
        elapsed,
    )
    return compiled


def _on_cuda(module: torch.nn.Module) -> bool:
    return any(p.device.type == "cuda" for p in module.parameters())


def _describe(args: Sequence[object], kwargs: dict[str, object]) -> str:
    shapes = [tuple(a.shape) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    return ", ".join(str(s) for s in shapes)
