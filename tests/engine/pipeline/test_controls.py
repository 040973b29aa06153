"""Per-request controls against diffusers: each offered scheduler, sampler options, clip_skip, several images.

References are diffusers' own runs on a pipeline loaded from the same folder: `Cls.from_config(default.config,
**options)` set on it, `pipe(..., clip_skip=N)`, `num_images_per_prompt` with one generator per image.
That pipeline is another one, its weights in other storage: its images agree with ours within 2 levels
(tests/support/images.py). Byte-equality stays for the same engine's images before and after.
"""

from __future__ import annotations

import asyncio
import dataclasses

import diffusers
import pytest
import torch
from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

from engine.errors import InvalidRequestError
from engine.families.tiny import tiny_scheduler
from engine.families.unet import SPEED_SCHEDULERS
from engine.pipeline.schedulers import offered_schedulers
from engine.requests import GenerateRequest, LoraSpec
from serving.backends import blocking
from tests.support.checks import backend_of, generate
from tests.support.images import assert_images_close

PROMPT = "a fox in a forest"
STEPS = 4  # PNDM's PRK steps need at least 4 on the tiny pipelines' scheduler config
# Every class a tiny pipeline's scheduler names compatible, and the speed schedulers: offered unless it cannot
# be built from the pool's config here (a missing library, or a config it cannot take).
CANDIDATES = sorted({*(cls.__name__ for cls in tiny_scheduler().compatibles), *SPEED_SCHEDULERS})


def request(seed: int = 3, steps: int = STEPS, **fields: object) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, steps=steps, width=64, height=64, seed=seed, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def reference_sdxl(tiny_dir):
    pipe = StableDiffusionXLPipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def reference_sd15(tiny_sd15_dir):
    from engine.families.stable_diffusion import alias_text_model

    pipe = StableDiffusionPipeline.from_pretrained(tiny_sd15_dir)
    pipe.set_progress_bar_config(disable=True)
    # diffusers 0.42's clip_skip path reads `text_encoder.text_model`, gone in transformers 5.6 (diffusers#14124):
    # the reference gets the alias the family gives a run's copy, or diffusers itself could not run it.
    alias_text_model(pipe)
    return pipe


def diffusers_images(pipe, scheduler: str | None = None, options: dict | None = None, seeds=(3,), **call):
    """diffusers' way: the scheduler class from the pipeline's config, one generator per image."""
    default = pipe.scheduler
    if scheduler is not None:
        pipe.scheduler = getattr(diffusers, scheduler).from_config(default.config, **(options or {}))
    generators = [torch.Generator("cpu").manual_seed(s) for s in seeds]
    try:
        out = pipe(
            prompt=PROMPT,
            num_inference_steps=call.pop("steps", STEPS),
            width=64,
            height=64,
            generator=generators if len(seeds) > 1 else generators[0],
            num_images_per_prompt=len(seeds),
            **call,
        )
    finally:
        pipe.scheduler = default
    return out.images


def test_the_offered_schedulers_are_the_pipelines_compatibles_and_the_speed_ones(loaded):
    compatibles = {cls.__name__ for cls in loaded.pipe.scheduler.compatibles}
    offered = set(loaded.defaults.schedulers)
    assert offered == set(offered_schedulers(loaded.pipe.scheduler, SPEED_SCHEDULERS))
    assert {"LCMScheduler", "TCDScheduler", "EulerAncestralDiscreteScheduler", "UniPCMultistepScheduler"} <= offered
    assert offered - compatibles == set(SPEED_SCHEDULERS)
    # Those whose library is not installed here are left out, not offered to fail later.
    assert "DPMSolverSDEScheduler" not in offered


@pytest.mark.parametrize("scheduler", CANDIDATES)
def test_each_offered_scheduler_equals_diffusers(engine, reference_sdxl, scheduler):
    if scheduler not in engine.defaults.schedulers:
        # Not buildable here (torchsde missing; EDM's sigmas absent from this config): refused up front.
        with pytest.raises(InvalidRequestError, match=f"scheduler '{scheduler}' is not offered here"):
            generate(engine, request(scheduler=scheduler))
        return
    ours = generate(engine, request(scheduler=scheduler))
    (expected,) = diffusers_images(reference_sdxl, scheduler)
    assert ours.request.scheduler == scheduler
    assert_images_close(ours, expected, scheduler)


@pytest.mark.parametrize(
    ("name", "options", "scheduler", "expected_options"),
    [
        ("DPM++ 2M Karras", (), "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
        ("Euler trailing", (), "EulerDiscreteScheduler", {"timestep_spacing": "trailing"}),
        ("DPM++ SDE Karras", (), "DPMSolverSinglestepScheduler", {"use_karras_sigmas": True}),
        ("UniPCMultistepScheduler", (("timestep_spacing", "trailing"),), "UniPCMultistepScheduler", None),
    ],
)
def test_sampler_names_and_options_equal_diffusers(engine, reference_sdxl, name, options, scheduler, expected_options):
    ours = generate(engine, request(scheduler=name, scheduler_options=options))
    wanted = expected_options if expected_options is not None else dict(options)
    (expected,) = diffusers_images(reference_sdxl, scheduler, wanted)
    assert (ours.request.scheduler, dict(ours.request.scheduler_options)) == (scheduler, wanted)
    assert_images_close(ours, expected, name)
    if not options:
        assert ours.request.sampler == name


def test_the_pools_scheduler_is_never_touched_and_the_default_comes_back_exactly(engine, loaded):
    pipe = loaded.pipe
    scheduler, config = pipe.scheduler, dict(pipe.scheduler.config)
    pipeline_config = dict(pipe.config)
    before = generate(engine, request(seed=11))
    for name in ("DPM++ 2M Karras", "LCM", "Euler a"):
        generate(engine, request(seed=11, scheduler=name))
    after = generate(engine, request(seed=11))
    assert pipe.scheduler is scheduler
    assert dict(pipe.scheduler.config) == config
    assert dict(pipe.config) == pipeline_config
    assert after.request.scheduler is None
    assert after.request.sampler == "Euler"
    assert after.image.tobytes() == before.image.tobytes()


@pytest.mark.timeout(900)
def test_different_schedulers_at_once_each_get_their_own_image(pools_two, reference_sdxl, reference_sd15):
    """Requests with different samplers, on both pools at once: each image is the one it would be alone."""
    from families.sd15 import MODEL_ID as SD15_MODEL_ID

    work = [
        (request(seed=20 + i, scheduler=name), base)
        for i, (name, base) in enumerate(
            [
                ("DPM++ 2M Karras", ""),
                ("Euler a", SD15_MODEL_ID),
                ("LCM", ""),
                (None, SD15_MODEL_ID),
                ("UniPC", ""),
                ("DDIM", SD15_MODEL_ID),
                (None, ""),
                ("TCD", SD15_MODEL_ID),
            ]
        )
    ]

    async def all_at_once():
        backend = backend_of(pools_two)
        return await asyncio.gather(*(backend.generate(r, base=b) for r, b in work))

    results = blocking(all_at_once())
    for (sent, base), result in zip(work, results, strict=True):
        reference = reference_sd15 if base else reference_sdxl
        scheduler = result.request.scheduler
        (expected,) = diffusers_images(
            reference, scheduler, dict(result.request.scheduler_options), seeds=(int(sent.seed or 0),)
        )
        assert_images_close(result, expected, (sent.scheduler, base))
    for pool in pools_two.pools:
        assert type(pool.engine.loaded.pipe.scheduler).__name__ == "EulerDiscreteScheduler"


@pytest.fixture
def pools_two(loaded, loaded_sd15, base_settings, clean_hub):
    from engine.pools.engine import Engine
    from engine.pools.pools import Pools
    from engine.pools.residency import Residency
    from engine.prepare.resolve import AdapterResolver
    from families.sd15 import MODEL_ID as SD15_MODEL_ID
    from lora_catalog.hub import HubSource

    resolver = AdapterResolver(
        HubSource(endpoint=clean_hub.url, timeout_s=5), local_dir=None, token=None, max_bytes=2**30
    )
    engines = [
        Engine(loaded, base_settings, resolver),
        Engine(loaded_sd15, base_settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    made = Pools(engines, resolver, Residency(torch.device("cpu"), None))
    yield made
    made.close()


@pytest.mark.parametrize(
    ("sent", "message"),
    [
        (
            {"scheduler": "NoSuchScheduler"},
            r"scheduler 'NoSuchScheduler' is not offered here; accepted: a sampler \(Euler,",
        ),
        ({"scheduler": "FlowMatchEulerDiscreteScheduler"}, r"not offered here; accepted: .*LCMScheduler"),
        ({"scheduler": 3}, r"scheduler=3 is not text; accepted: a sampler"),
        (
            {"scheduler": "DDIM", "scheduler_options": (("use_karras_sigmas", True),)},
            r"scheduler DDIMScheduler has no option use_karras_sigmas; accepted for it: timestep_spacing",
        ),
        ({"scheduler_options": (("beta_start", 0.1),)}, r"scheduler option 'beta_start' is not accepted; accepted: "),
        (
            {"scheduler_options": (("use_karras_sigmas", 1),)},
            r"use_karras_sigmas=1 is not accepted; accepted: true, false",
        ),
        ({"clip_skip": 2}, r"clip_skip=2 is out of range; accepted: an integer from 0 to 1"),
        ({"clip_skip": 0.5}, r"clip_skip=0.5 is not an integer"),
        ({"num_images": 5}, r"num_images=5 is out of range; accepted: an integer from 1 to 4"),
        ({"num_images": 0}, r"num_images=0 is out of range"),
    ],
)
def test_bad_controls_are_refused_naming_what_is_accepted(engine, sent, message):
    with pytest.raises(InvalidRequestError, match=message):
        generate(engine, request(**sent))


def test_options_alone_apply_to_the_pools_own_scheduler(engine, reference_sdxl):
    ours = generate(engine, request(scheduler_options={"timestep_spacing": "trailing"}))
    (expected,) = diffusers_images(reference_sdxl, "EulerDiscreteScheduler", {"timestep_spacing": "trailing"})
    assert ours.request.sampler == "Euler trailing"
    assert_images_close(ours, expected)


@pytest.mark.parametrize("clip_skip", [1])
def test_clip_skip_equals_diffusers_on_sdxl(engine, reference_sdxl, clip_skip):
    ours = generate(engine, request(clip_skip=clip_skip))
    (expected,) = diffusers_images(reference_sdxl, clip_skip=clip_skip)
    plain = generate(engine, request())
    assert ours.request.clip_skip == clip_skip
    assert_images_close(ours, expected)
    assert ours.image.tobytes() != plain.image.tobytes()


@pytest.mark.parametrize("clip_skip", [1, 2])
def test_clip_skip_equals_diffusers_on_sd15(make_engine, loaded_sd15, reference_sd15, clip_skip):
    from engine.pools.engine import Engine
    from families.sd15 import MODEL_ID as SD15_MODEL_ID

    probe = make_engine()
    sd15 = Engine(loaded_sd15, probe.settings.replace(base_model_id=SD15_MODEL_ID), probe.resolver)
    try:
        assert sd15.defaults.max_clip_skip == 2  # the tiny encoder's 3 layers, less the one always used
        ours = generate(sd15, request(clip_skip=clip_skip))
        again = generate(sd15, request(clip_skip=clip_skip, scheduler="DDIM"))
        (expected,) = diffusers_images(reference_sd15, clip_skip=clip_skip)
        (expected_ddim,) = diffusers_images(reference_sd15, "DDIMScheduler", clip_skip=clip_skip)
        assert_images_close(ours, expected)
        # A second run (its own copy of the pipeline) reads the same layer: nothing recorded twice.
        assert_images_close(again, expected_ddim)
    finally:
        sd15.close()
    # Only the run's copy had the alias: the pool's encoder is as transformers made it.
    assert not hasattr(loaded_sd15.pipe.text_encoder, "text_model")


def test_without_the_alias_diffusers_itself_cannot_clip_skip_on_sd15(tiny_sd15_dir):
    """Why the SD families alias `text_model` (diffusers#14124): once this fails, the alias can go."""
    pipe = StableDiffusionPipeline.from_pretrained(tiny_sd15_dir)
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(AttributeError, match="text_model"):
        pipe(prompt=PROMPT, num_inference_steps=1, width=64, height=64, clip_skip=1)


class Swaps:
    """An engine observer counting swaps (every other event ignored)."""

    def __init__(self) -> None:
        self.count = 0

    def swapped(self, seconds: float) -> None:
        self.count += 1

    def __getattr__(self, name: str):
        return lambda *args: None


def test_several_images_are_one_batch_with_consecutive_seeds_each_reproducible_alone(engine, fixtures, reference_sdxl):
    spec = LoraSpec(fixtures["peft"], scale=0.8)
    swaps = Swaps()
    engine.events.subscribe(swaps)  # type: ignore[arg-type]
    batch = generate(engine, request(seed=40, num_images=3, loras=(spec,), scheduler="Euler a"))
    assert batch.seeds == (40, 41, 42)
    assert len(batch.images) == 3
    assert swaps.count == 1, "one swap for the whole batch"
    for seed, image in zip(batch.seeds, batch.images, strict=True):
        alone = generate(engine, request(seed=seed, loras=(spec,), scheduler="Euler a")).image
        assert_images_close(image, alone, seed)  # a batch splits its sums otherwise than one image
    assert len({image.tobytes() for image in batch.images}) == 3


def test_several_images_equal_diffusers_batch(engine, reference_sdxl):
    ours = generate(engine, request(seed=7, num_images=2, scheduler="DPM++ 2M"))
    expected = diffusers_images(reference_sdxl, "DPMSolverMultistepScheduler", seeds=(7, 8))
    assert len(ours.images) == len(expected) == 2
    for seed, image, reference in zip((7, 8), ours.images, expected, strict=True):
        assert_images_close(image, reference, seed)


def test_seeds_wrap_within_the_seed_range(engine):
    result = generate(engine, request(seed=2**32 - 1, num_images=2, steps=1))
    assert result.seeds == (2**32 - 1, 0)
    assert dataclasses.replace(result.request, num_images=1).seeds == (2**32 - 1,)


def test_a_batch_that_runs_out_of_memory_is_made_one_image_at_a_time(loaded):
    """The GPU path's fallback, driven on the CPU: the batch call fails as CUDA would, the images come one by one,
    each the one its seed gives alone (here exactly: each is a run of one image)."""
    from engine.pipeline.inference import infer
    from engine.requests import CheckedRequest

    calls: list[int] = []

    class Tight:
        """The pipeline, with a device too small for more than one image at a time."""

        vae_scale_factor = loaded.pipe.vae_scale_factor

        def __call__(self, **kwargs):
            calls.append(kwargs.get("num_images_per_prompt", 1))
            if calls[-1] > 1:
                raise torch.OutOfMemoryError("CUDA out of memory (as a test says)")
            return loaded.pipe(**kwargs)

    checked = CheckedRequest(PROMPT, steps=2, guidance=5.0, width=64, height=64, seed=30, num_images=3, sampler="Euler")
    common = {
        "family": loaded.family,
        "tokenizers": {},
        "progress": None,
        "cancel": None,
        "decoder": None,
        "preview_every": 2,
    }
    images = infer(Tight(), checked, **common).pictures
    assert calls == [3, 1, 1, 1]
    alone = [
        infer(loaded.pipe, dataclasses.replace(checked, seed=s, num_images=1), **common).pictures[0]
        for s in (30, 31, 32)
    ]
    assert [i.tobytes() for i in images] == [i.tobytes() for i in alone]
