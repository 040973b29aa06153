"""Samplers by the names people know (A1111's), and the diffusers scheduler class and options each one is.

A request names a sampler either by such a name ("DPM++ 2M Karras") or by a diffusers scheduler class
("DPMSolverMultistepScheduler") with options (`use_karras_sigmas`, `timestep_spacing`, ...). The table follows
diffusers' own mapping of A1111/k-diffusion samplers (its schedulers overview: "DPM++ 2M Karras" is
`DPMSolverMultistepScheduler` with `use_karras_sigmas=True`, "DPM++ SDE Karras" `DPMSolverSinglestepScheduler`
with it, A1111's `sgm_uniform` schedule `timestep_spacing="trailing"`), plus the few-step schedulers of the
speed LoRAs (LCM, TCD; "Euler trailing" for SDXL-Lightning, "DDIM trailing" for Hyper-SD, "Euler a trailing"
for Turbo), and "Euler flow" for the flow-matching pipelines (FLUX.1, Z-Image, Qwen-Image). Which classes a pool accepts
is its family's and its pipeline's (`ModelDefaults.schedulers`); this module imports no torch (the UI's menu
reads it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lora_catalog.errors import InvalidRequestError

__all__ = [
    "OPTION_VALUES",
    "SAMPLERS",
    "Sampler",
    "SchedulerOptions",
    "choose_scheduler",
    "find_sampler",
    "menu",
    "sampler_label",
    "scheduler_options",
]

# (option, value) pairs, sorted by option: hashable, so a request stays frozen.
SchedulerOptions = tuple[tuple[str, bool | str], ...]

# The scheduler options a request may set, and the values each takes (where the class has the option: the
# engine checks the class's own signature). Only options that pick a schedule: no betas, no training length.
OPTION_VALUES: dict[str, tuple[bool | str, ...]] = {
    "use_karras_sigmas": (True, False),
    "use_exponential_sigmas": (True, False),
    "use_beta_sigmas": (True, False),
    "timestep_spacing": ("leading", "linspace", "trailing"),
}


@dataclass(frozen=True)
class Sampler:
    """A sampler's name, the diffusers scheduler class it is, and the options it sets on the pool's config."""

    label: str
    scheduler: str
    options: SchedulerOptions = ()


_TRAILING: SchedulerOptions = (("timestep_spacing", "trailing"),)
_KARRAS: SchedulerOptions = (("use_karras_sigmas", True),)

SAMPLERS: tuple[Sampler, ...] = (
    Sampler("Euler", "EulerDiscreteScheduler"),
    Sampler("Euler a", "EulerAncestralDiscreteScheduler"),
    Sampler("DPM++ 2M", "DPMSolverMultistepScheduler"),
    Sampler("DPM++ 2M Karras", "DPMSolverMultistepScheduler", _KARRAS),
    Sampler("DPM++ SDE Karras", "DPMSolverSinglestepScheduler", _KARRAS),
    Sampler("UniPC", "UniPCMultistepScheduler"),
    Sampler("DDIM", "DDIMScheduler"),
    Sampler("LCM", "LCMScheduler"),
    Sampler("TCD", "TCDScheduler"),
    Sampler("Euler trailing", "EulerDiscreteScheduler", _TRAILING),
    Sampler("Euler a trailing", "EulerAncestralDiscreteScheduler", _TRAILING),
    Sampler("DDIM trailing", "DDIMScheduler", _TRAILING),
    Sampler("DPM++ 2M SDE", "DPMSolverMultistepScheduler", (("algorithm_type", "sde-dpmsolver++"),)),
    Sampler("Heun", "HeunDiscreteScheduler"),
    Sampler("DPM2", "KDPM2DiscreteScheduler"),
    Sampler("DPM2 a", "KDPM2AncestralDiscreteScheduler"),
    Sampler("DEIS", "DEISMultistepScheduler"),
    Sampler("DDPM", "DDPMScheduler"),
    Sampler("PNDM", "PNDMScheduler"),
    # The flow-matching pipelines' (FLUX.1, Z-Image, Qwen-Image): Euler on the flow, the one class their pipelines
    # take (they pass `sigmas` and `mu` to `set_timesteps`); named apart from "Euler", which is EulerDiscreteScheduler.
    Sampler("Euler flow", "FlowMatchEulerDiscreteScheduler"),
)
_BY_LABEL = {s.label.lower(): s for s in SAMPLERS}
# A1111 (1.9 and later) writes the schedule apart ("Sampler: DPM++ 2M, Schedule type: Karras"): the suffix of
# the combined name it stands for (diffusers' table: sgm_uniform and simple are trailing spacing).
_SCHEDULE_SUFFIX = {"karras": "karras", "sgm uniform": "trailing", "simple": "trailing", "automatic": "", "uniform": ""}


def find_sampler(name: str, schedule_type: str = "") -> Sampler | None:
    """The sampler a name people use means (case-blind; with A1111's separate schedule type), or None."""
    key = " ".join(name.split()).lower()
    schedule = " ".join(schedule_type.replace("_", " ").split()).lower()
    suffix = _SCHEDULE_SUFFIX.get(schedule) if schedule else ""
    if suffix is None:
        return None
    return _BY_LABEL.get(f"{key} {suffix}".strip())


def sampler_label(scheduler: str, options: SchedulerOptions) -> str:
    """The name people know for a class with these options, else the class name with its options."""
    wanted = tuple(sorted(options))
    for sampler in SAMPLERS:
        if sampler.scheduler == scheduler and tuple(sorted(sampler.options)) == wanted:
            return sampler.label
    shown = ", ".join(f"{k}={v}" for k, v in wanted)
    return f"{scheduler} ({shown})" if shown else scheduler


def menu(accepted: Iterable[str]) -> tuple[str, ...]:
    """The sampler names whose class a pool accepts, in the table's order (the UI's menu)."""
    classes = set(accepted)
    return tuple(s.label for s in SAMPLERS if s.scheduler in classes)


def choose_scheduler(
    value: object, raw_options: object, default: str, accepted: tuple[str, ...]
) -> tuple[str | None, SchedulerOptions]:
    """The scheduler class a request names (a sampler name, or a class in `accepted`) and its checked options;
    (None, ()) for the pool's own scheduler. InvalidRequestError names the accepted samplers and classes."""
    options = scheduler_options(raw_options)
    if value is None or value == "":
        if not options:
            return None, ()
        if not default:
            raise InvalidRequestError("scheduler_options need a scheduler here; accepted: a scheduler named with them")
        # Options alone apply to the pool's own class (a new instance of it, for this run).
        return default, options
    listed = f"a sampler ({', '.join(menu(accepted))}) or a scheduler class ({', '.join(accepted)})"
    if not isinstance(value, str):
        raise InvalidRequestError(f"scheduler={value!r} is not text; accepted: {listed}")
    sampler = find_sampler(value)
    name, preset = (sampler.scheduler, sampler.options) if sampler is not None else (value.strip(), ())
    if name not in accepted:
        why = "is not compatible with this pool's pipeline" if sampler is not None else "is not offered here"
        raise InvalidRequestError(f"scheduler {value!r} {why}; accepted: {listed}")
    # The request's own options win over the sampler's (DPM++ 2M Karras with use_karras_sigmas=false is DPM++ 2M).
    return name, tuple(sorted((dict(preset) | dict(options)).items()))


def scheduler_options(value: object) -> SchedulerOptions:
    """(option, value) pairs from a mapping or pairs, each option one of OPTION_VALUES with one of its values."""
    if value is None:
        return ()
    items = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(items, list | tuple):
        raise InvalidRequestError(f"scheduler_options={value!r} is not a set of options; accepted: {_OPTIONS}")
    options: dict[str, bool | str] = {}
    for item in items:
        if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidRequestError(f"scheduler option {item!r} is not a (name, value) pair; accepted: {_OPTIONS}")
        name, option = item
        if name not in OPTION_VALUES:
            raise InvalidRequestError(f"scheduler option {name!r} is not accepted; accepted: {_OPTIONS}")
        # `1 == True`: the type is compared as well as the value.
        if not any(type(option) is type(v) and option == v for v in OPTION_VALUES[name]):
            values = ", ".join(str(v).lower() if isinstance(v, bool) else repr(v) for v in OPTION_VALUES[name])
            raise InvalidRequestError(f"scheduler option {name}={option!r} is not accepted; accepted: {values}")
        options[name] = option
    return tuple(sorted(options.items()))


_OPTIONS = ", ".join(OPTION_VALUES)
