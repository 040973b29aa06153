"""A comparison as the UI and the API take and show it: form fields in, info JSON and a timing table out.

Pure functions, no Gradio, like `serving.ui.formatting` (whose helpers they share).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping
from typing import Any

from engine.compare import CompareRequest, CompareResult
from engine.errors import InvalidRequestError
from engine.requests import LoraSpec
from serving.ui.formatting import result_info, seconds, seed_value

__all__ = ["compare_html", "compare_info", "compare_request"]


def compare_request(
    prompt: str,
    negative_prompt: str | None,
    loras: str | None,
    scales: str | None,
    include_base: object,
    steps: float | None,
    guidance: float | None,
    width: float | None,
    height: float | None,
    seed: float | None,
    scheduler: str | None = None,
    clip_skip: float | None = None,
    starting: Mapping[str, Any] | None = None,
    starts: str | None = None,
    ends: str | None = None,
) -> CompareRequest:
    """A comparison from form fields: LoRAs one per line (or comma-separated), scales as a list of numbers.

    No scale: each LoRA at 1. One scale: every LoRA at it. One per LoRA: each its own. Several scales for a
    single LoRA: a sweep, one cell per scale. `starts` and `ends` are each LoRA's window (`LoraSpec.start`/`end`,
    fractions of the steps), listed as scales are: none (every step), one for all, or one per LoRA; a sweep's
    LoRA keeps its window in every cell. A LoRA listed twice with two windows is two cells (a schedule is a cell).
    """
    refs = [r.strip() for r in re.split(r"[,\n]", loras or "") if r.strip()]
    values = [_scale(token) for token in _tokens(scales)]
    if not isinstance(include_base, bool):
        raise InvalidRequestError(f"include_base={include_base!r} is not accepted; accepted: true or false")
    sweep, per_lora = _scales(values, len(refs))
    windows = zip(_window(starts, "starts", 0.0, len(refs)), _window(ends, "ends", 1.0, len(refs)), strict=True)
    return CompareRequest(
        prompt=prompt,
        negative_prompt=negative_prompt or "",
        loras=tuple(
            LoraSpec(ref, scale, start=start, end=end)
            for ref, scale, (start, end) in zip(refs, per_lora, windows, strict=False)
        ),
        scales=sweep,
        include_base=include_base,
        # Passed as given: the engine refuses a non-integer by name rather than rounding it here.
        steps=steps,  # type: ignore[arg-type]
        guidance=guidance,
        width=width,  # type: ignore[arg-type]
        height=height,  # type: ignore[arg-type]
        seed=seed_value(seed),  # type: ignore[arg-type]
        scheduler=(scheduler or "").strip() or None,
        clip_skip=clip_skip or None,  # type: ignore[arg-type]
        # The image every cell starts from (`image`, `mask_image`, `strength`; none: text-to-image).
        **(starting or {}),
    )


def _scales(values: list[float], count: int) -> tuple[tuple[float, ...], list[float]]:
    """The sweep (several scales for a single LoRA; else none) and each LoRA's scale."""
    if count == 1 and len(values) > 1:
        return tuple(values), [1.0]
    if not values:
        return (), [1.0] * count
    if len(values) == 1:
        return (), values * count
    if len(values) == count:
        return (), values
    raise InvalidRequestError(
        f"{len(values)} scales for {count} LoRAs; accepted: no scale (each at 1), one scale for all, "
        "one scale per LoRA, or several scales for a single LoRA (a sweep)"
    )


def _tokens(text: str | None) -> list[str]:
    return [token for token in re.split(r"[,;\s]+", (text or "").strip()) if token]


def _window(text: str | None, name: str, whole: float, count: int) -> list[float | None]:
    """`starts` or `ends` as one value per LoRA (None: not set); `whole` (0 for a start, 1 for an end: every
    step) is not set, as the UI's range sends it. Values pass as given otherwise: the engine checks the range."""
    values: list[float | None] = []
    for token in _tokens(text):
        try:
            value = float(token)
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise InvalidRequestError(
                f"{name} has {token!r}, not a number; accepted: fractions of the steps from 0 to 1 separated by "
                "commas, e.g. 0, 0.5"
            )
        values.append(None if value == whole else value)
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise InvalidRequestError(
            f"{len(values)} {name} for {count} LoRAs; accepted: none (every step), one for all, or one per LoRA"
        )
    return values


def _scale(token: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidRequestError(
            f"scale {token!r} is not a number; accepted: numbers from -2 to 2 separated by commas, e.g. 0, 0.5, 1"
        )
    return value


def compare_info(result: CompareResult) -> dict[str, Any]:
    """The API's description of a comparison: the shared seed, and each cell's label and result info."""
    return {
        "seed": result.seed,
        "labels": list(result.labels),
        "cells": [{"label": label, **result_info(r)} for label, r in zip(result.labels, result.results, strict=True)],
        "total_s": result.total_s,
    }


def compare_html(result: CompareResult) -> str:
    """One line per cell (label, swap and inference time), and the shared seed."""
    request = result.results[0].request
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>swap {seconds(r.timings.apply)}</td>"
        f"<td>inference {seconds(r.timings.inference)}</td></tr>"
        for label, r in zip(result.labels, result.results, strict=True)
    )
    return (
        f'<div class="result-info"><p><b>Seed</b> <code>{result.seed}</code> · {request.width} × {request.height} · '
        f"{request.steps} steps · guidance {request.guidance:g} · {len(result.results)} cells in "
        f"{seconds(result.total_s)}</p><table class='timing'>{rows}</table></div>"
    )
