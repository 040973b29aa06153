"""Progress plumbing: the engine's per-step callbacks turned into Gradio's progress bar, for a generation (with the
time left at the pace of the steps so far, and the wait for the GPU under step sharing) and for a comparison."""

from __future__ import annotations

import time
from collections.abc import Callable

import gradio as gr

from engine.pipeline.stepshare import Ahead
from serving.ui import formatting as fmt

__all__ = ["CellProgress", "StepProgress"]


class StepProgress:
    """Feeds the engine's per-step callback into Gradio's progress bar (a class, so ZeroGPU can pickle it), with
    the time left expected at the pace of the steps so far (counted from the first step seen, so loading and
    the text encoders are not taken for denoising)."""

    def __init__(self, progress: gr.Progress, clock: Callable[[], float] = time.monotonic) -> None:
        self.progress = progress
        self.clock = clock
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, int] | None = None

    def __call__(self, step: int, total: int) -> None:
        now = self.clock()
        self.last = (step, total)
        if self.first is None or step < self.first[0]:
            self.first = (step, now)
        done = step - self.first[0]
        desc = "Denoising"
        if done > 0 and step < total:
            desc += f" (about {fmt.seconds((now - self.first[1]) / done * (total - step))} left)"
        self.progress((step, total), desc=desc, unit="steps")

    def waiting(self, ahead: Ahead) -> None:
        """The run waits for the GPU (`engine.pipeline.stepshare`): say behind what; the pace restarts after."""
        self.first = None
        self.progress(self.last or (0, 1), desc=str(ahead), unit="steps")


class CellProgress:
    """The same for a comparison: which cell, and its steps."""

    def __init__(self, progress: gr.Progress) -> None:
        self.progress = progress

    def __call__(self, cell: int, step: int, total: int) -> None:
        self.progress((step, total), desc=f"Cell {cell + 1}: denoising", unit="steps")
