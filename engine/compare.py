"""Comparison grids: one prompt, one seed, one base; a row of cells that differ only in their LoRA.

A `CompareRequest` is either several LoRAs (one cell each, at its own scale) or a scale sweep of one
LoRA, optionally with the base model first. `plan_cells` turns it into one ordinary `GenerateRequest`
per cell — so a cell is exactly what `/generate` returns for the same inputs — checked against the
grid's limits (cells, and denoising steps over all cells). The runner queues the grid as one ticket first
(a full queue refuses it before anything is downloaded), the scheduler prepares every cell on its bounded
threads (`open_cells`), and the cells run in that one queue turn with `Engine.run_many`: the pipeline is held
once, and the swap between cells is the engine's exact one (pristine weights copied back, the next set fused).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from engine.errors import InvalidRequestError, LimitExceededError
from engine.images import RequestImage
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, GenerateResult, Limits, LoraSpec, ModelDefaults
from engine.schedules import strength_text

if TYPE_CHECKING:  # the engine module brings torch; `import app` must stay light
    from engine.pools.engine import Engine, PreparedRequest

__all__ = ["MAX_COMPARE_LORAS", "CompareCell", "CompareRequest", "CompareResult", "open_cells", "plan_cells"]

# The "a row of images for up to 4 LoRAs"; a sweep's length is bounded by MAX_COMPARE_CELLS.
MAX_COMPARE_LORAS = 4
BASE_LABEL = "base"


@dataclass(frozen=True)
class CompareRequest:
    """Several LoRAs (one cell each, at its scale), or one LoRA at each of `scales`; the base first if asked."""

    prompt: str
    loras: tuple[LoraSpec, ...]
    scales: tuple[float, ...] = ()
    include_base: bool = False
    negative_prompt: str = ""
    steps: int | None = None
    guidance: float | None = None
    width: int | None = None
    height: int | None = None
    seed: int | None = None
    # The sampler and CLIP skip every cell runs with (as `GenerateRequest`'s).
    scheduler: str | None = None
    scheduler_options: tuple[tuple[str, object], ...] = ()
    clip_skip: int | None = None
    # The image every cell starts from, its mask and the strength (as `GenerateRequest`'s; none: text-to-image).
    image: RequestImage | None = None
    mask_image: RequestImage | None = None
    strength: float | None = None
    # Further reference images after `image` (as `GenerateRequest.images`), the same for every cell.
    images: tuple[RequestImage, ...] = ()


@dataclass(frozen=True)
class CompareCell:
    label: str
    request: GenerateRequest


@dataclass(frozen=True)
class CompareResult:
    """The cells in order, each with its label and result; every cell shares `seed`."""

    labels: tuple[str, ...]
    results: tuple[GenerateResult, ...]
    seed: int
    total_s: float


@dataclass(frozen=True)
class CompareLimits:
    max_cells: int
    max_steps: int


def plan_cells(
    request: CompareRequest, defaults: ModelDefaults, limits: Limits, grid: CompareLimits
) -> tuple[CompareCell, ...]:
    """One request per cell, all with the same normalised prompt, size, steps, guidance and seed."""
    loras = request.loras if isinstance(request.loras, tuple | list) else None
    if not loras:
        raise InvalidRequestError(
            f"no LoRA to compare (got {request.loras!r}); accepted: 1 to {MAX_COMPARE_LORAS} LoRAs, "
            "or one LoRA with several scales"
        )
    specs = _cell_specs(tuple(loras), tuple(request.scales))
    count = len(specs) + (1 if request.include_base else 0)
    if count > grid.max_cells:
        raise LimitExceededError(
            f"{count} cells requested ({_describe_count(specs, request.include_base)}); "
            f"accepted: at most {grid.max_cells} cells in one comparison"
        )
    # Normalised once, with the first cell's LoRA: every cell then shares the same seed and settings.
    shared = normalise_request(
        GenerateRequest(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            loras=specs[0][1],
            steps=request.steps,
            guidance=request.guidance,
            width=request.width,
            height=request.height,
            seed=request.seed,
            scheduler=request.scheduler,
            scheduler_options=request.scheduler_options,
            clip_skip=request.clip_skip,
            image=request.image,
            mask_image=request.mask_image,
            strength=request.strength,
            images=request.images,
            # A grid of images: a video pool is refused here, before anything runs.
            expects="image",
        ),
        defaults,
        limits,
    )
    steps = shared.steps or 0
    if count * steps > grid.max_steps:
        raise LimitExceededError(
            f"{count} cells x {steps} steps = {count * steps} steps; accepted: at most {grid.max_steps} steps "
            f"in one comparison (fewer cells or fewer steps)"
        )
    cells = [CompareCell(BASE_LABEL, replace(shared, loras=()))] if request.include_base else []
    # Every cell checked now (a sweep's scales included), before anything is downloaded.
    cells += [
        CompareCell(label, normalise_request(replace(shared, loras=cell_loras), defaults, limits))
        for label, cell_loras in specs
    ]
    return tuple(cells)


def open_cells(engine: Engine, cells: Sequence[CompareCell]) -> tuple[tuple[PreparedRequest, ...], Callable[[], None]]:
    """Prepare every cell (outside the pipeline lock; the scheduler runs this as the grid's one ticket's
    preparation); all adapters stay leased until the returned release is called."""
    stack = ExitStack()
    try:
        # Each cell's scheduler built from the pool's config (`Engine.check`), as a request's is before queueing.
        prepared = tuple(stack.enter_context(engine.prepare(engine.check(cell.request))) for cell in cells)
    except BaseException:
        stack.close()
        raise
    return prepared, stack.close


def _cell_specs(loras: tuple[LoraSpec, ...], scales: tuple[float, ...]) -> list[tuple[str, tuple[LoraSpec, ...]]]:
    for spec in loras:
        if not isinstance(spec, LoraSpec):
            raise InvalidRequestError(f"LoRA entry {spec!r} is not a LoraSpec")
    if scales:
        if len(loras) != 1:
            raise InvalidRequestError(
                f"a scale sweep takes exactly one LoRA, got {len(loras)} with scales {list(scales)}; accepted: "
                "one LoRA with several scales, or several LoRAs with one scale each"
            )
        for scale in scales:
            if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
                raise InvalidRequestError(f"sweep scale {scale!r} is not a number; accepted: numbers from -2 to 2")
        if len(set(scales)) != len(scales):
            twice = next(s for s in scales if scales.count(s) > 1)
            raise InvalidRequestError(f"sweep scale {twice:g} is listed twice; accepted: each scale once")
        return [(label_of(replace(loras[0], scale=s)), (replace(loras[0], scale=s),)) for s in scales]
    if len(loras) > MAX_COMPARE_LORAS:
        raise LimitExceededError(
            f"{len(loras)} LoRAs to compare; accepted: at most {MAX_COMPARE_LORAS} (or one LoRA with several scales)"
        )
    # A schedule is a cell of its own: one LoRA may come plain and scheduled (each schedule once).
    identities = [(s.ref, s.revision, s.weight_name, s.schedule, s.start, s.end, s.schedule_2) for s in loras]
    if len(set(identities)) != len(identities):
        repeated = next(i[0] for i in identities if identities.count(i) > 1)
        raise InvalidRequestError(
            f"LoRA {repeated!r} is listed twice; accepted: each LoRA once, or once per schedule (for several "
            "scales of one LoRA, a sweep)"
        )
    return [(label_of(spec), (spec,)) for spec in loras]


def label_of(spec: LoraSpec) -> str:
    """A cell's label: the LoRA's short name and its strength (`engine.schedules.strength_text`): `pixel-art-xl
    (0.5)`, `sda (1 from 0 to 0.25)` for a window, `ramp (0@0.4 0.5@0.9)` for a schedule (each segment's from@scale)."""
    name = PurePosixPath(spec.ref.removeprefix("local:")).name.removesuffix(".safetensors") or spec.ref
    return f"{name} ({strength_text(spec)})"


def _describe_count(specs: Sequence[object], base: bool) -> str:
    return f"{len(specs)} LoRA cells" + (" and the base" if base else "")
