"""The sampler names people know, against diffusers' own table of A1111 equivalents (no pipeline here)."""

from __future__ import annotations

import diffusers
import pytest

from engine.errors import InvalidRequestError
from engine.samplers import SAMPLERS, choose_scheduler, find_sampler, menu, sampler_label

ACCEPTED = ("DDIMScheduler", "DPMSolverMultistepScheduler", "EulerDiscreteScheduler", "LCMScheduler")


def test_every_sampler_names_a_diffusers_scheduler_class_that_has_its_options():
    import inspect

    for sampler in SAMPLERS:
        cls = getattr(diffusers, sampler.scheduler)
        parameters = inspect.signature(cls.__init__).parameters
        assert all(name in parameters for name, _ in sampler.options), sampler


@pytest.mark.parametrize(
    ("name", "schedule", "label", "scheduler", "options"),
    [
        # diffusers' schedulers overview, "A1111/k-diffusion" against "Diffusers" and its usage column.
        ("DPM++ 2M Karras", "", "DPM++ 2M Karras", "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
        ("dpm++ 2m  karras", "", "DPM++ 2M Karras", "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
        ("DPM++ 2M", "Karras", "DPM++ 2M Karras", "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
        ("DPM++ SDE", "Karras", "DPM++ SDE Karras", "DPMSolverSinglestepScheduler", {"use_karras_sigmas": True}),
        ("Euler", "SGM Uniform", "Euler trailing", "EulerDiscreteScheduler", {"timestep_spacing": "trailing"}),
        ("Euler a", "Automatic", "Euler a", "EulerAncestralDiscreteScheduler", {}),
        ("UniPC", "", "UniPC", "UniPCMultistepScheduler", {}),
        ("LCM", "", "LCM", "LCMScheduler", {}),
    ],
)
def test_names_people_use_find_their_scheduler(name, schedule, label, scheduler, options):
    sampler = find_sampler(name, schedule)
    assert sampler is not None
    assert (sampler.label, sampler.scheduler, dict(sampler.options)) == (label, scheduler, options)
    assert sampler_label(sampler.scheduler, sampler.options) == label


def test_unknown_names_and_schedules_find_nothing():
    assert find_sampler("Restart") is None
    assert find_sampler("Euler a", "Karras") is None
    assert find_sampler("Euler", "Exponential") is None


def test_a_class_with_options_no_name_covers_is_shown_with_them():
    assert sampler_label("UniPCMultistepScheduler", (("timestep_spacing", "trailing"),)) == (
        "UniPCMultistepScheduler (timestep_spacing=trailing)"
    )


def test_the_menu_lists_the_names_whose_class_a_pool_accepts_in_the_tables_order():
    assert menu(ACCEPTED) == ("Euler", "DPM++ 2M", "DPM++ 2M Karras", "DDIM", "LCM", "Euler trailing", "DDIM trailing",
                              "DPM++ 2M SDE")  # fmt: skip


def test_choosing_a_scheduler_merges_the_names_options_with_the_requests():
    assert choose_scheduler(None, (), "EulerDiscreteScheduler", ACCEPTED) == (None, ())
    assert choose_scheduler("DDIM", None, "EulerDiscreteScheduler", ACCEPTED) == ("DDIMScheduler", ())
    chosen = choose_scheduler("DPM++ 2M Karras", {"timestep_spacing": "trailing"}, "", ACCEPTED)
    assert chosen == ("DPMSolverMultistepScheduler", (("timestep_spacing", "trailing"), ("use_karras_sigmas", True)))
    # The request's own value wins over the name's.
    off = choose_scheduler("DPM++ 2M Karras", [("use_karras_sigmas", False)], "", ACCEPTED)
    assert off == ("DPMSolverMultistepScheduler", (("use_karras_sigmas", False),))
    assert choose_scheduler("", {"timestep_spacing": "trailing"}, "EulerDiscreteScheduler", ACCEPTED) == (
        "EulerDiscreteScheduler",
        (("timestep_spacing", "trailing"),),
    )


@pytest.mark.parametrize(
    ("value", "options", "message"),
    [
        ("Euler a", (), r"'Euler a' is not compatible with this pool's pipeline; accepted: a sampler \(Euler, DPM"),
        ("Nope", (), r"'Nope' is not offered here; accepted: .*scheduler class \(DDIMScheduler, "),
        ("DDIM", {"timestep_spacing": "late"}, r"timestep_spacing='late' is not accepted; accepted: 'leading', "),
        ("DDIM", {"use_karras_sigmas": "yes"}, r"use_karras_sigmas='yes' is not accepted; accepted: true, false"),
        ("DDIM", "trailing", r"scheduler_options='trailing' is not a set of options"),
        ("DDIM", [("timestep_spacing",)], r"scheduler option \('timestep_spacing',\) is not a \(name, value\) pair"),
        (None, {"use_karras_sigmas": True}, r"scheduler_options need a scheduler here"),
    ],
)
def test_bad_choices_name_what_is_accepted(value, options, message):
    with pytest.raises(InvalidRequestError, match=message):
        choose_scheduler(value, options, "", ACCEPTED)
