"""A request's LoRA list checked for `engine.normalise.normalise_request` (the one gate): each reference parsed
(a Hub repo, a local file or a Civitai LoRA; nothing else path- or URL-like), its scales held to SCALE_RANGE, its
schedule checked, each LoRA listed once, at most the limit; a low-noise scale only where the pool has a low-noise
side. Each refusal names the value and what is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from engine.errors import InvalidRequestError, LimitExceededError
from engine.requests import LOCAL_PREFIX, SCALE_RANGE, LoraSpec, ModelDefaults
from engine.schedules import checked_spec
from engine.values import checked_number as _float
from lora_catalog import refs
from lora_catalog.civitai.refs import ACCEPTED as CIVITAI_ACCEPTED
from lora_catalog.civitai.refs import parse_civitai

__all__ = ["checked_loras", "normalise_loras", "parse_ref", "second_scales"]


def parse_ref(ref: object) -> tuple[Literal["hub", "local", "civitai"], str]:
    """Split a LoRA reference into its kind and name, refusing anything path- or URL-like but Civitai's forms
    (`lora_catalog.civitai.refs`), which become their canonical `civitai:<version>` / `civitai:models/<model>`."""
    civitai = parse_civitai(ref)
    if civitai is not None:
        return "civitai", civitai.canonical
    try:
        if isinstance(ref, str) and refs.is_local_ref(ref.strip()):
            return "local", refs.parse_local_ref(ref.strip()).as_posix()
        return "hub", refs.validate_repo_id(ref)  # type: ignore[arg-type]
    except InvalidRequestError as e:
        raise InvalidRequestError(
            f"{e}; or a local LoRA as 'local:<file>.safetensors'; or a Civitai LoRA: {CIVITAI_ACCEPTED}"
        ) from e


def normalise_loras(value: object, limit: int, segments: int = 64) -> tuple[LoraSpec, ...]:
    """A request's LoRAs checked and normalised as `normalise_request` does (the pools route on these; `segments`
    at MAX_SCHEDULE_SEGMENTS' ceiling there: the chosen pool's own check holds the setting)."""
    return checked_loras(value, limit, segments)


def checked_loras(value: object, limit: int, segments: int) -> tuple[LoraSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(f"loras must be a list of LoRA specs, got {type(value).__name__}")
    if len(value) > limit:
        raise LimitExceededError(f"{len(value)} LoRAs requested; accepted: at most {limit} per request")
    specs: list[LoraSpec] = []
    for spec in value:
        if not isinstance(spec, LoraSpec):
            raise InvalidRequestError(f"LoRA entry {spec!r} is not a LoraSpec")
        kind, name = parse_ref(spec.ref)
        # A Civitai reference names its version and file itself: a revision or file given with it is dropped, as
        # for a local file.
        ref = f"{LOCAL_PREFIX}{name}" if kind == "local" else name
        revision = _checked(refs.validate_revision, spec.revision) if kind == "hub" else None
        weight_name = _checked(refs.validate_weight_name, spec.weight_name) if kind == "hub" else None
        scale = _float(f"scale of {ref}", spec.scale, 1.0, *SCALE_RANGE)
        scale_2 = None if spec.scale_2 is None else _float(f"scale_2 of {ref}", spec.scale_2, 1.0, *SCALE_RANGE)
        spec = replace(spec, ref=ref, scale=scale, revision=revision, weight_name=weight_name, scale_2=scale_2)
        specs.append(checked_spec(spec, segments))
    identities = [(s.ref, s.revision, s.weight_name) for s in specs]
    if len(set(identities)) != len(identities):
        twice = next(i[0] for i in identities if identities.count(i) > 1)
        raise InvalidRequestError(f"LoRA {twice!r} is listed twice; accepted: each LoRA once, with one scale")
    return tuple(specs)


def second_scales(loras: tuple[LoraSpec, ...], defaults: ModelDefaults) -> tuple[LoraSpec, ...]:
    """A low-noise scale (`scale_2`) applies on a two-transformer pool (`ModelDefaults.two_stage`: Wan 2.2 A14B's
    low-noise transformer; `scale` is the high-noise one's); elsewhere one other than `scale` is refused, as such
    a pool has no low-noise side. One equal to `scale` is dropped (None: the same scale), so both ask one set.
    So is a low-noise schedule (`schedule_2`) there: the schedule of a side the request does not run."""
    for spec in loras:
        if spec.scale_2 is not None and spec.scale_2 != spec.scale and not defaults.two_stage:
            raise InvalidRequestError(
                f"scale_2={spec.scale_2:g} of {spec.ref} was given, but this pool's model has one transformer; "
                "accepted: scale alone, or scale_2 equal to it"
            )
        if len(spec.schedule_2) > 1 and spec.schedule_2 != spec.schedule and not defaults.two_stage:
            raise InvalidRequestError(
                f"schedule_2 of {spec.ref} was given, but this pool's model has one transformer (no low-noise side "
                "to run it); accepted: schedule (or start/end) alone"
            )
    if not defaults.two_stage:
        return tuple(replace(s, scale_2=None, schedule_2=()) for s in loras)
    return tuple(replace(s, scale_2=None) if s.scale_2 == s.scale and not s.schedule_2 else s for s in loras)


def _checked(check: Callable[[str | None], str | None], value: object) -> str | None:
    return check(value or None)  # type: ignore[arg-type]
