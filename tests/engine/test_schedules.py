"""A LoRA's strength by step: the rule, and every bad schedule a 400 naming what is accepted (issue 51, item 1)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.compare import CompareLimits, CompareRequest, plan_cells
from engine.errors import InvalidRequestError, LimitExceededError
from engine.normalise import normalise_request
from engine.requests import GenerateRequest, Limits, LoraSpec, ModelDefaults
from engine.schedules import scale_at, scales_at, schedule_fields, strength_text

POOL = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)
TWO_STAGE = dataclasses.replace(POOL, video=True, guidance_2=3.0, num_frames=5, fps=16, max_frames=9)
LIMITS = Limits(max_loras=4, max_steps=60, max_prompt_chars=100, max_schedule_segments=3)
ACCEPTED = "accepted: a list of [from, scale] pairs"


def checked(spec: LoraSpec, defaults: ModelDefaults = POOL) -> LoraSpec:
    return normalise_request(GenerateRequest(prompt="a fox", loras=(spec,)), defaults, LIMITS).loras[0]


def test_the_issue_example_over_four_steps():
    spec = checked(LoraSpec("owner/lora", schedule=((0, 1.0), (0.5, 0.0))))
    assert [scale_at(spec.schedule, i, 4) for i in range(4)] == [1.0, 1.0, 0.0, 0.0]
    # The text encoders run before step 0: `scale` is step 0's value.
    assert spec.scale == 1.0 and spec.scheduled


def test_the_short_form_is_the_scale_on_start_to_end_and_zero_elsewhere():
    spec = checked(LoraSpec("owner/lora", scale=0.7, start=0.25, end=0.75))
    assert spec.schedule == ((0.0, 0.0), (0.25, 0.7), (0.75, 0.0))
    assert (spec.start, spec.end, spec.scale) == (None, None, 0.0)
    assert [scale_at(spec.schedule, i, 8) for i in range(8)] == [0, 0, 0.7, 0.7, 0.7, 0.7, 0, 0]
    # Forge's SDA example: strength 1.0 on the first quarter (steps 0-1 of 8).
    sda = checked(LoraSpec("owner/lora", start=0, end=0.25))
    assert [scale_at(sda.schedule, i, 8) for i in range(8)] == [1, 1, 0, 0, 0, 0, 0, 0]


def test_a_fraction_sent_as_a_decimal_lands_on_its_step():
    # 0.1 as a float is just over 1/10: step 1 of 10 still starts that segment.
    assert [scale_at(((0.0, 1.0), (0.1, 0.5)), i, 10) for i in range(3)] == [1.0, 0.5, 0.5]


def test_a_schedule_of_one_scale_is_that_scale():
    assert checked(LoraSpec("owner/lora", schedule=((0, 0.6), (0.5, 0.6)))) == LoraSpec("owner/lora", 0.6)
    assert checked(LoraSpec("owner/lora", scale=0.6, start=0, end=1)) == LoraSpec("owner/lora", 0.6)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (LoraSpec("o/l", schedule=((0, 1.0), (1.5, 0.0))), "1.5, outside [0, 1]"),
        (LoraSpec("o/l", schedule=((0, 1.0), (-0.5, 0.0))), "-0.5, outside [0, 1]"),
        (LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0), (0.25, 1.0))), "0.25 after one at 0.5: not increasing"),
        (LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0), (0.5, 1.0))), "not increasing"),
        (LoraSpec("o/l", schedule=((0.2, 1.0),)), "begins at 0.2, not 0"),
        (LoraSpec("o/l", schedule=((0, float("nan")),)), "each a finite number"),
        (LoraSpec("o/l", schedule=((float("nan"), 1.0),)), "each a finite number"),
        (LoraSpec("o/l", schedule=((0, 1.0, 2.0),)), "each a finite number"),  # type: ignore[arg-type]
        (LoraSpec("o/l", schedule=((0, 1.0), (0.5, 5.0))), "scales from -2 to 2"),
        (LoraSpec("o/l", schedule=((0, 1.0),), start=0.5), "one of them"),
        (LoraSpec("o/l", start=0.5, end=0.5), "0 ≤ start < end ≤ 1"),
        (LoraSpec("o/l", start=float("nan")), "a fraction of the steps from 0 to 1"),
        (LoraSpec("o/l", end=1.5), "a fraction of the steps from 0 to 1"),
    ],
)
def test_a_bad_schedule_is_a_400_naming_what_is_accepted(spec, said):
    with pytest.raises(InvalidRequestError) as refused:
        checked(spec)
    assert refused.value.status == 400
    assert said in str(refused.value) and "accepted" in str(refused.value)


def test_more_segments_than_the_setting_is_refused_naming_it():
    spec = LoraSpec("o/l", schedule=((0, 1.0), (0.25, 0.5), (0.5, 0.25), (0.75, 0.0)))
    with pytest.raises(LimitExceededError, match=r"4 segments; accepted: at most 3 \(MAX_SCHEDULE_SEGMENTS\)") as e:
        checked(spec)
    assert e.value.status == 400


def test_a_low_noise_schedule_on_a_pool_with_one_transformer_is_refused():
    with pytest.raises(InvalidRequestError, match=r"one transformer .*accepted: schedule"):
        checked(LoraSpec("o/l", schedule_2=((0, 1.0), (0.5, 0.0))))


def test_a_wan_pairs_sides_take_their_own_schedules_or_the_pairs():
    adapters = [("pair", 1.0, None)]  # its scales are the spec's
    own = checked(LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0)), schedule_2=((0, 0.5), (0.75, 1.0))), TWO_STAGE)
    assert [scales_at((own,), adapters, i, 4)[0][1:] for i in range(4)] == [
        (1.0, 0.5),
        (1.0, 0.5),
        (0.0, 0.5),
        (0.0, 1.0),
    ]
    pairs = checked(LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0))), TWO_STAGE)
    assert [scales_at((pairs,), adapters, i, 4)[0][1:] for i in range(4)] == [(1.0, None)] * 2 + [(0.0, None)] * 2
    # Equal scales on both sides are one scale (None), as a checked request's are.
    same = checked(LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0)), schedule_2=((0, 0.5), (0.5, 0.0))), TWO_STAGE)
    assert scales_at((same,), adapters, 3, 4)[0][1:] == (0.0, None)
    # A constant low-noise scale beside a high-noise schedule stays the low-noise side's.
    kept = checked(LoraSpec("o/l", scale_2=1.0, schedule=((0, 1.0), (0.5, 0.0))), TWO_STAGE)
    assert [scales_at((kept,), adapters, i, 4)[0][1:] for i in range(4)] == [(1.0, None)] * 2 + [(0.0, 1.0)] * 2
    # The short form with a low-noise scale: that scale in the same window.
    window = checked(LoraSpec("o/l", scale=1.0, scale_2=0.5, end=0.5), TWO_STAGE)
    assert [scales_at((window,), adapters, i, 4)[0][1:] for i in range(4)] == [(1.0, 0.5)] * 2 + [(0.0, None)] * 2


@pytest.mark.parametrize(
    "spec",
    [
        LoraSpec("o/l", 2.0, start=0.25, end=0.5),
        LoraSpec("o/l", 1.0, scale_2=0.5, end=0.5),
        LoraSpec("o/l", schedule=((0, 1.0), (0.5, 0.0)), schedule_2=((0, 0.5), (0.75, 1.0))),
        LoraSpec("o/l", 0.8, scale_2=0.3),
    ],
)
def test_a_checked_loras_schedule_fields_sent_back_check_to_the_same_lora(spec):
    """A result's info says each LoRA's schedules as `parameters.loras[i]` takes them: sent back beside the step-0
    scales, they are the same checked LoRA (the same steps); a LoRA without one adds no field."""
    first = checked(spec, TWO_STAGE)
    fields = schedule_fields(first)
    assert set(fields) <= {"schedule", "schedule_2"}
    assert bool(fields) == bool(first.schedule or first.schedule_2)
    sent = {name: tuple(map(tuple, value)) for name, value in fields.items()}
    assert checked(LoraSpec("o/l", first.scale, scale_2=first.scale_2, **sent), TWO_STAGE) == first


def test_a_schedule_is_a_cell_of_a_comparison_grid():
    sda = LoraSpec("owner/sda", 1.0, start=0, end=0.25)
    ramp = LoraSpec("owner/sda", schedule=((0, 0.4), (0.5, 0.9)))
    compare = CompareRequest("a fox", loras=(LoraSpec("owner/sda", 1.0), sda, ramp), steps=4, seed=3)
    cells = plan_cells(compare, POOL, LIMITS, CompareLimits(max_cells=4, max_steps=100))
    assert [c.label for c in cells] == ["sda (1)", "sda (1 from 0 to 0.25)", "sda (0@0.4 0.5@0.9)"]
    # Each cell is the request /generate checks for it: its LoRA's schedule checked as any request's is.
    assert [c.request.loras[0].schedule for c in cells] == [(), ((0.0, 1.0), (0.25, 0.0)), ((0.0, 0.4), (0.5, 0.9))]
    with pytest.raises(InvalidRequestError, match="listed twice; accepted: each LoRA once, or once per schedule"):
        plan_cells(dataclasses.replace(compare, loras=(sda, sda)), POOL, LIMITS, CompareLimits(4, 100))


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        (LoraSpec("o/l", 0.8), "0.8"),
        (LoraSpec("o/l", 0.8, end=0.5), "0.8 from 0 to 0.5"),
        (LoraSpec("o/l", 0.7, start=0.25, end=0.75), "0.7 from 0.25 to 0.75"),
        (LoraSpec("o/l", 0.7, start=0.5), "0.7 from 0.5 to 1"),
        (LoraSpec("o/l", schedule=((0, 0.4), (0.5, 0.9))), "0@0.4 0.5@0.9"),
    ],
)
def test_a_loras_strength_reads_the_same_before_and_after_the_check(spec, shown):
    """One text for a LoRA's strength: a comparison's captions (made before the check) and a result's info (from
    the checked request, where a window is a schedule whose `scale` is step 0's) say the same."""
    assert strength_text(spec) == shown
    assert strength_text(checked(spec)) == shown
