"""Every sampler a pool offers, with each option its class takes and each pair of sigma schedules: either
accepted and run, or refused (a 400 naming the options and what is accepted) before the request is queued.
Never a failure inside the run (issue 28: beta sigmas without scipy, two sigma schedules at once, were 500s)."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator

import diffusers
import pytest

from engine.errors import InvalidRequestError
from engine.requests import GenerateRequest
from engine.samplers import OPTION_VALUES, SchedulerOptions
from tests.support.checks import generate

SIGMAS = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")
# PNDM's PRK steps need 4 on the tiny pipelines' scheduler config (tests/engine/pipeline/test_controls.py).
STEPS = 4


def combinations(scheduler: str) -> Iterator[SchedulerOptions]:
    """Each option the class takes with each of its values alone, then each pair of sigma schedules."""
    takes = inspect.signature(getattr(diffusers, scheduler).__init__).parameters
    for option, values in OPTION_VALUES.items():
        if option in takes:
            yield from (((option, value),) for value in values)
    for first, second in itertools.combinations([s for s in SIGMAS if s in takes], 2):
        yield ((first, True), (second, True))


@pytest.fixture(params=["loaded", "loaded_flux", "loaded_zimage", "loaded_flux2", "loaded_qwen_image"])
def pool_engine(request: pytest.FixtureRequest, base_settings):
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver

    loaded = request.getfixturevalue(request.param)
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(loaded, base_settings.replace(base_model_id=loaded.base_model_id), resolver)
    yield engine
    engine.close()


# A run per offered option and sigma pair: past the 300 s default on two busy cores (a CI run at load 8 beside two
# spinners).
@pytest.mark.timeout(900)
def test_every_offered_option_and_sigma_pair_runs_or_is_refused_before_queueing(pool_engine, monkeypatch):
    queued: list[GenerateRequest] = []
    submit = pool_engine.scheduler.submit

    def counting(request, prepare=None):
        queued.append(request)
        return submit(request, prepare)

    monkeypatch.setattr(pool_engine.scheduler, "submit", counting)
    ran, refused = [], []
    for scheduler in pool_engine.defaults.schedulers:
        for options in combinations(scheduler):
            request = GenerateRequest(
                prompt="a fox",
                steps=STEPS,
                width=64,
                height=64,
                seed=1,
                scheduler=scheduler,
                scheduler_options=options,  # type: ignore[arg-type]
            )
            before = len(queued)
            try:
                result = generate(pool_engine, request)
            except InvalidRequestError as e:
                assert len(queued) == before, f"{scheduler} {options} was queued before it was refused"
                assert all(name in str(e) for name, _ in options), str(e)
                assert "accepted" in str(e)
                refused.append((scheduler, options))
                continue
            assert result.image.size == (64, 64)
            assert (result.request.scheduler, result.request.scheduler_options) == (scheduler, options)
            ran.append((scheduler, options))
    # The refusals are exactly the pairs of sigma schedules (diffusers takes one at a time); every option alone runs,
    # beta sigmas included (scipy is a requirement).
    assert all(sum(name in SIGMAS and value is True for name, value in o) == 2 for _, o in refused), refused
    assert any(dict(o).get("use_beta_sigmas") is True and len(o) == 1 for _, o in ran)
    assert refused


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            (("use_exponential_sigmas", True), ("use_karras_sigmas", True)),
            r"scheduler EulerDiscreteScheduler cannot run with use_exponential_sigmas=true, use_karras_sigmas=true: "
            r"Only one of .* can be used.*; accepted for it: .*use_karras_sigmas.*, one of use_karras_sigmas, "
            r"use_exponential_sigmas, use_beta_sigmas at a time",
        ),
    ],
)
def test_two_sigma_schedules_are_refused_naming_them(engine, options, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.check(GenerateRequest(prompt="a fox", scheduler="Euler", scheduler_options=options))  # type: ignore[arg-type]


def test_beta_sigmas_build_here():
    """The README offers beta sigmas; diffusers computes them with scipy, which the requirements pin."""
    scheduler = diffusers.EulerDiscreteScheduler(use_beta_sigmas=True)
    scheduler.set_timesteps(4)
    assert len(scheduler.sigmas) == 5
