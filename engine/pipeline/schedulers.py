"""A run's own scheduler: the class a request names, built from the pool's scheduler config, for that run only.

The pool's scheduler is never replaced or reconfigured: a request naming a sampler runs on a shallow copy of
the pipeline holding `Cls.from_config(pool.scheduler.config, **options)`, sharing every model, so the next
request sees the pool's scheduler exactly as it was. A pool offers its scheduler's `compatibles` and its
family's extras that can be built here. A request's class and options are built once when it is checked, before
it is queued (`check_scheduler`): what diffusers refuses is a 400 there, never a failure inside the run.
Why a copy, not `from_pipe`: docs/internals.md, "engine/pipeline/schedulers.py".
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from typing import Any

import diffusers

from engine.errors import InvalidRequestError
from engine.families.spec import FamilySpec
from engine.pipeline.modes import mode_pipeline
from engine.requests import CheckedRequest
from engine.samplers import OPTION_VALUES, SchedulerOptions

__all__ = ["build_scheduler", "check_scheduler", "offered_schedulers", "run_pipeline"]

logger = logging.getLogger(__name__)

# A diffusers pipeline or scheduler (see engine.pipeline.loading.Pipeline).
Pipeline = Any
# The options that each pick a whole sigma schedule: diffusers takes one at a time.
_SIGMAS = tuple(name for name in OPTION_VALUES if name.endswith("_sigmas"))


def offered_schedulers(default: Any, extras: tuple[str, ...]) -> tuple[str, ...]:
    """The scheduler classes a request may name on a pipeline whose scheduler is `default`, sorted."""
    names = [type(default).__name__, *(cls.__name__ for cls in default.compatibles), *extras]
    offered = []
    for name in dict.fromkeys(names):
        try:
            _class(name).from_config(default.config)
        except (ImportError, AttributeError, ValueError, TypeError) as e:
            # A class whose backend is missing is one of diffusers' placeholders, which raise ImportError here (its
            # message starts with a blank line: its first line of text says which library is missing).
            logger.info(
                "scheduler %s is not offered: %s", name, str(e).strip().splitlines()[0] if str(e).strip() else type(e)
            )
            continue
        offered.append(name)
    return tuple(sorted(offered))


def check_scheduler(request: CheckedRequest, default: Any) -> None:
    """Refuse a scheduler the run could not build from the pool's scheduler `default`: options its class does not
    have, and options diffusers refuses together or cannot serve here (InvalidRequestError names them and what is
    accepted)."""
    if request.scheduler is None:
        return
    accepted = _options_of(request.scheduler)
    offered = ", ".join(sorted(set(accepted) & set(OPTION_VALUES))) or "none"
    unknown = [name for name, _ in request.scheduler_options if name not in accepted]
    if unknown:
        raise InvalidRequestError(
            f"scheduler {request.scheduler} has no option {', '.join(unknown)}; accepted for it: {offered}"
        )
    failure = _build_failure(default, request.scheduler, request.scheduler_options)
    if failure is not None:
        shown = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in request.scheduler_options)
        schedules = [k for k, v in request.scheduler_options if k in _SIGMAS and v is True]
        rule = f", one of {', '.join(_SIGMAS)} at a time" if len(schedules) > 1 else ""
        raise InvalidRequestError(
            f"scheduler {request.scheduler} cannot run with {shown}: {_first_line(failure)}; accepted for it: "
            f"{offered}{rule}"
        ) from failure


# Built once per pool, class and options: building one takes 10-250 ms on a loaded 2-core CPU (LMS the most),
# and a request is checked before it is queued and again when prepared. A pool's scheduler lives as long as the
# process, so holding it here keeps nothing alive that would otherwise go.
@functools.lru_cache(maxsize=512)
def _build_failure(default: Any, name: str, options: SchedulerOptions) -> Exception | None:
    try:
        build_scheduler(default, name, options)
    except (ImportError, ValueError, TypeError) as e:
        # ImportError: a library the option needs (scipy for beta sigmas); ValueError: a combination diffusers
        # refuses ("Only one of use_beta_sigmas, use_exponential_sigmas, use_karras_sigmas can be used").
        return e
    return None


def build_scheduler(default: Any, name: str, options: SchedulerOptions) -> Any:
    """A new scheduler of class `name` from the pool's scheduler config, with `options` set on it."""
    return _class(name).from_config(default.config, **dict(options))


def run_pipeline(pipe: Pipeline, request: CheckedRequest, family: FamilySpec) -> Pipeline:
    """The pipeline a run calls: the pool's own (or its mode's, for a request with an image), or a shallow copy
    holding the request's own scheduler (and, with `clip_skip`, what the family needs for it:
    `FamilySpec.prepare_clip_skip`)."""
    clip_skip = family.prepare_clip_skip if request.clip_skip else None
    # A request with an image: the mode's pipeline over the same components (`engine.pipeline.modes`).
    pipe = mode_pipeline(pipe, request, family)
    if request.scheduler is None and clip_skip is None:
        return pipe
    view = copy.copy(pipe)
    if request.scheduler is not None:
        # DiffusionPipeline.__setattr__ records the component in the copy's own config dict (a new one: the
        # pool's stays as it is).
        view.scheduler = build_scheduler(pipe.scheduler, request.scheduler, request.scheduler_options)
    if clip_skip is not None:
        clip_skip(view)
    return view


def _class(name: str) -> Any:
    cls = getattr(diffusers, name, None)
    if not isinstance(cls, type) or not name.endswith("Scheduler"):
        raise AttributeError(f"diffusers has no scheduler class {name!r}")
    return cls


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _options_of(name: str) -> tuple[str, ...]:
    return tuple(inspect.signature(_class(name).__init__).parameters)
