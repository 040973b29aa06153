"""One LoRA of a request (`LoraSpec`): kept apart from `engine.requests` so that each module stays small;
`engine.requests` exports it with the request it belongs to."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoraSpec"]


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA of a request: a Hub repo id, `local:<file>` or a Civitai reference; its scale, optional revision
    and file (Hub repos only)."""

    ref: str
    scale: float = 1.0
    revision: str | None = None
    weight_name: str | None = None
    # The low-noise transformer's scale on a two-transformer pool (Wan 2.2 A14B: `transformer_2`); `scale` is the
    # high-noise one's. None: `scale` for both. Refused on a pool with one transformer.
    scale_2: float | None = None
    # Its strength by step (`engine.schedules`: the rule): ((from, scale), ...), from a fraction of the steps; empty:
    # `scale` throughout. Or the short form: `scale` on [start, end) of the steps, 0 elsewhere. Once checked
    # (`engine.normalise`), the short form is a `schedule`, `scale` is its step-0 value (the text encoders'), and a
    # schedule of one scale is that `scale`.
    schedule: tuple[tuple[float, float], ...] = ()
    start: float | None = None
    end: float | None = None
    # The low-noise transformer's own schedule on a two-transformer pool; empty: `scale_2` where given, else the
    # high-noise side's (`schedule`, or `scale`). Refused on a pool with one transformer.
    schedule_2: tuple[tuple[float, float], ...] = ()

    @property
    def scheduled(self) -> bool:
        """Whether its strength changes between steps (a checked spec: a schedule of two scales or more)."""
        return len(self.schedule) > 1 or len(self.schedule_2) > 1
