"""The defaults a request's LoRAs bring: what they recommend (`lora_catalog.hints`), checked against the pool.

Where the client set nothing, a speed LoRA's sampler, steps and guidance, and a card's or a file's recommended
settings, take the place of the pool's defaults (`engine.requests.with_suggested` applies them and records
where each came from). A blend takes a speed LoRA's settings first (`blend_hints`). A recommendation this pool
cannot follow — a sampler it does not offer, more steps than it allows, a CLIP skip its model does not take — is
left out with a warning, never refused: the client did not ask for it. `final_request` is the request a pool
runs: its LoRAs' defaults filled, and what it sets that the model does not read named.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.errors import InvalidRequestError
from engine.normalise import with_suggested
from engine.requests import CheckedRequest, Limits, ModelDefaults, Suggested
from engine.samplers import choose_scheduler
from engine.video_references import trained_downscale
from lora_catalog.hints import LoraHints, blend_hints

__all__ = ["final_request", "suggested_defaults"]


def final_request(
    checked: CheckedRequest,
    hints: Sequence[LoraHints],
    defaults: ModelDefaults,
    limits: Limits,
    trained: Sequence[tuple[str, str | None]] = (),
) -> tuple[CheckedRequest, tuple[str, ...], tuple[str, ...]]:
    """`checked` (without its LoRAs' defaults) with them where the client set nothing and it asks for them
    (`with_suggested`: not checked again), and at its IC-LoRAs' `trained` reference downscale (each LoRA's label
    and metadata: `engine.video_references.trained_downscale`, whatever `lora_defaults` says); the warnings for
    what it sets that the model does not read (`ModelDefaults.ignored`), and the notes on the recommendations
    left out or the trained factor not followed."""
    suggested, notes = suggested_defaults(hints if checked.lora_defaults else (), defaults, limits)
    if suggested is not None:
        checked = with_suggested(checked, suggested, defaults)
    checked, differs = trained_downscale(checked, trained, defaults.side_multiple)
    return checked, defaults.ignored(checked), (*notes, *differs)


def suggested_defaults(
    hints: Iterable[LoraHints], defaults: ModelDefaults, limits: Limits
) -> tuple[Suggested | None, tuple[str, ...]]:
    """The request's LoRAs' defaults for this pool (None when they recommend nothing), and what was left out."""
    blended = blend_hints(hints)
    if blended.empty:
        return None, ()
    notes: list[str] = []
    where = {field: source for field, source in blended.sources}
    steps = blended.steps
    if steps is not None and steps > limits.max_steps:
        notes.append(f"{where['steps']} recommends {steps} steps; this Space allows {limits.max_steps}: not used")
        steps = None
    scheduler = blended.sampler
    if scheduler is not None:
        try:
            choose_scheduler(scheduler, (), defaults.scheduler, defaults.schedulers)
        except InvalidRequestError:
            notes.append(f"{where['sampler']} recommends the sampler {scheduler!r}, which this pool does not offer")
            scheduler = None
    clip_skip = blended.clip_skip
    if clip_skip is not None and clip_skip > defaults.max_clip_skip:
        notes.append(
            f"{where['clip_skip']} recommends CLIP skip {clip_skip + 1} (A1111's count); this model takes "
            f"{'none' if defaults.max_clip_skip == 0 else f'up to {defaults.max_clip_skip + 1}'}: not used"
        )
        clip_skip = None
    guidance = blended.guidance
    if guidance is not None and defaults.guidance_kind == "none":
        notes.append(f"{where['guidance']} recommends guidance {guidance:g}; this model takes none: not used")
        guidance = None
    # A speed LoRA's guidance (distilled without CFG) is both stages' on a two-stage pool (Wan 2.2 A14B).
    guidance_2 = guidance if defaults.two_stage and blended.speed else None
    # The request's names for the hints' fields.
    used = {
        "steps": steps,
        "guidance": guidance,
        "scheduler": scheduler,
        "clip_skip": clip_skip,
        "guidance_2": guidance_2,
    }
    hint_field = {"scheduler": "sampler", "guidance_2": "guidance"}
    sources = tuple((name, where[hint_field.get(name, name)]) for name, value in used.items() if value is not None)
    suggested = Suggested(steps, guidance, scheduler, clip_skip, sources, guidance_2)
    return suggested, tuple(notes)
