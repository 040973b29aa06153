"""Per-request controls on the flow-matching pools (the tiny FLUX.1 [dev], Z-Image Turbo and FLUX.2 [klein]): the
one sampler their pipelines take and its options, other samplers and CLIP skip refused naming what is accepted,
several images with consecutive seeds, and each image's recipe.

References are diffusers' own runs on a pipeline loaded from the same folder: another pipeline, its weights in
other storage, so its images agree with ours within 2 levels (tests/support/images.py).
"""

from __future__ import annotations

import re

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

from engine.errors import InvalidRequestError
from engine.requests import GenerateRequest
from serving.recipes import parse_recipe, with_recipes
from tests.support.checks import generate
from tests.support.images import assert_images_close

PROMPT = "a fox in a forest"


def request(seed: int = 3, steps: int = 2, **fields: object) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, steps=steps, width=64, height=64, seed=seed, **fields)  # type: ignore[arg-type]


@pytest.fixture(params=["flux", "zimage", "flux2"])
def flow_engine(request: pytest.FixtureRequest, base_settings):
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver

    loaded = request.getfixturevalue(f"loaded_{request.param}")
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(loaded, base_settings.replace(base_model_id=loaded.base_model_id), resolver)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference_flux(tiny_flux_dir):
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_a_flow_pool_offers_euler_flow_alone(flow_engine):
    defaults = flow_engine.defaults
    assert defaults.schedulers == ("FlowMatchEulerDiscreteScheduler",)
    assert (defaults.sampler, defaults.samplers, defaults.max_clip_skip) == ("Euler flow", ("Euler flow",), 0)
    result = generate(flow_engine, request())
    assert (result.request.scheduler, result.request.sampler) == (None, "Euler flow")


@pytest.mark.parametrize("name", ["Euler", "DPM++ 2M Karras", "LCM"])
def test_a_sampler_a_flow_pipeline_cannot_take_is_refused_naming_its_samplers(flow_engine, name):
    accepted = r"accepted: a sampler \(Euler flow\) or a scheduler class \(FlowMatchEulerDiscreteScheduler\)"
    with pytest.raises(
        InvalidRequestError, match=rf"scheduler '{re.escape(name)}' is not compatible with .*; {accepted}"
    ):
        generate(flow_engine, request(scheduler=name))


def test_clip_skip_is_refused_on_a_flow_pool_saying_why(flow_engine):
    with pytest.raises(InvalidRequestError, match=r"clip_skip=1 is not accepted: .* no CLIP skip \(its pipeline has"):
        generate(flow_engine, request(clip_skip=1))
    # Unset or 0 is the pipeline's own encoding.
    assert generate(flow_engine, request(clip_skip=0)).request.clip_skip == 0


def test_euler_flow_with_karras_sigmas_equals_diffusers_on_flux(loaded_flux, base_settings, reference_flux):
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver

    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=2**30)
    engine = Engine(loaded_flux, base_settings.replace(base_model_id=loaded_flux.base_model_id), resolver)
    try:
        # Four steps: at two, Karras's sigmas are the same two ends as the default schedule's.
        options = {"use_karras_sigmas": True}
        ours = generate(engine, request(seed=5, steps=4, scheduler="Euler flow", scheduler_options=options))
        plain = generate(engine, request(seed=5, steps=4)).image
    finally:
        engine.close()
    default = reference_flux.scheduler
    reference_flux.scheduler = FlowMatchEulerDiscreteScheduler.from_config(default.config, use_karras_sigmas=True)
    try:
        expected = reference_flux(
            prompt=PROMPT,
            num_inference_steps=4,
            guidance_scale=ours.request.guidance,
            width=64,
            height=64,
            generator=torch.Generator("cpu").manual_seed(5),
        ).images[0]
    finally:
        reference_flux.scheduler = default
    assert ours.request.sampler == "FlowMatchEulerDiscreteScheduler (use_karras_sigmas=True)"
    assert_images_close(ours, expected)
    assert ours.image.tobytes() != plain.tobytes()


def test_two_images_have_consecutive_seeds_each_its_seed_alone_with_its_recipe(flow_engine):
    batch = generate(flow_engine, request(seed=40, num_images=2))
    assert batch.seeds == (40, 41)
    for seed, image in zip(batch.seeds, batch.images, strict=True):
        alone = generate(flow_engine, request(seed=seed)).image
        assert_images_close(image, alone, seed)
    assert batch.images[0].tobytes() != batch.images[1].tobytes()
    model = flow_engine.loaded.model_name
    for seed, image in zip(batch.seeds, with_recipes(batch).images, strict=True):
        recipe = parse_recipe(image.info["parameters"])
        assert recipe.parameters["Model"] == model
        assert (recipe.parameters["Sampler"], recipe.request.seed) == ("Euler flow", seed)
        assert "Clip skip" not in recipe.parameters
