"""A LoRA's own defaults: a speed LoRA's sampler, steps and guidance, a card's settings, a file's CLIP skip.

They apply where the client set nothing; the client's values win; a blend takes the speed LoRA's; what a pool
cannot follow is left out with a warning. The images are the engine's own for the same settings sent explicitly.
"""

from __future__ import annotations

import pytest

from engine.requests import GenerateRequest, LoraSpec
from serving.demo.synthetic import make_lora
from tests.support.checks import generate
from tests.support.loras import SDXL, WEIGHTS, card, peft_file, sft, targets_for

PROMPT = "a fox in a forest"


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=loras, width=64, height=64, seed=5, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def repos(hub, loaded) -> dict[str, str]:
    pipe = loaded.pipe
    settings = {"num_inference_steps": 3, "guidance_scale": 3.5, "scheduler": "DPM++ 2M Karras"}
    unfollowable = {"num_inference_steps": 100, "scheduler": "Restart", "clip_skip": 7}
    trained = make_lora(targets_for(pipe), rank=2, seed=73, fmt="peft", strength=0.2)
    made = {
        "lcm": ("hints/lcm-lora-tiny", card(SDXL), peft_file(pipe, seed=70)),
        "card": ("hints/card-settings", card(SDXL, inference={"parameters": settings}), peft_file(pipe, seed=71)),
        "odd": ("hints/odd-card", card(SDXL, inference={"parameters": unfollowable}), peft_file(pipe, seed=72)),
        "skip": ("hints/clip-skip-2", card(SDXL), sft(trained, {"ss_clip_skip": "2"})),
    }
    for repo_id, readme, weights in made.values():
        hub.add_repo(repo_id, {"README.md": readme, WEIGHTS: weights})
    return {role: repo_id for role, (repo_id, _, _) in made.items()}


def test_a_speed_lora_brings_its_sampler_steps_and_guidance(engine, repos):
    lcm = LoraSpec(repos["lcm"])
    result = generate(engine, request(lcm))
    checked = result.request
    assert (checked.steps, checked.guidance, checked.scheduler, checked.sampler) == (4, 1.0, "LCMScheduler", "LCM")
    sources = dict(checked.defaults_from)
    assert set(sources) == {"steps", "guidance", "scheduler"}
    assert sources["scheduler"] == "speed LoRA (LCM, from its name 'hints/lcm-lora-tiny')"
    explicit = generate(engine, request(lcm, steps=4, guidance=1.0, scheduler="LCM"))
    assert result.image.tobytes() == explicit.image.tobytes()
    assert explicit.request.defaults_from == ()


def test_what_the_client_sets_wins_and_a_blend_takes_the_speed_loras_settings(engine, repos, fixtures):
    lcm, style = LoraSpec(repos["lcm"]), LoraSpec(fixtures["peft"], 0.8)
    mine = generate(engine, request(lcm, steps=2, scheduler="Euler")).request
    assert (mine.steps, mine.scheduler, mine.guidance) == (2, "EulerDiscreteScheduler", 1.0)
    assert dict(mine.defaults_from).keys() == {"guidance"}
    blend = generate(engine, request(style, lcm)).request
    assert (blend.steps, blend.guidance, blend.sampler) == (4, 1.0, "LCM")
    plain = generate(engine, request(style)).request
    assert (plain.steps, plain.guidance, plain.sampler, plain.defaults_from) == (4, 5.0, "Euler", ())


def test_a_cards_recommended_settings_and_a_files_clip_skip_are_the_defaults(engine, repos):
    carded = generate(engine, request(LoraSpec(repos["card"]))).request
    assert (carded.steps, carded.guidance, carded.sampler) == (3, 3.5, "DPM++ 2M Karras")
    assert set(dict(carded.defaults_from).values()) == {"the card (inference parameters)"}
    skipped = generate(engine, request(LoraSpec(repos["skip"]))).request
    assert skipped.clip_skip == 1
    assert dict(skipped.defaults_from)["clip_skip"] == "its training metadata (ss_clip_skip=2)"


def test_what_a_pool_cannot_follow_is_left_out_with_a_warning(engine, repos):
    result = generate(engine, request(LoraSpec(repos["odd"])))
    assert (result.request.steps, result.request.sampler, result.request.clip_skip) == (4, "Euler", 0)
    warnings = " | ".join(result.warnings)
    assert "recommends 100 steps; this Space allows 60: not used" in warnings
    assert "recommends the sampler 'Restart', which this pool does not offer" in warnings
    assert "recommends CLIP skip 8 (A1111's count); this model takes up to 2: not used" in warnings


def test_without_lora_defaults_the_pools_own_are_used(engine, repos):
    off = generate(engine, request(LoraSpec(repos["lcm"]), lora_defaults=False)).request
    assert (off.steps, off.guidance, off.sampler, off.defaults_from) == (4, 5.0, "Euler", ())


def test_on_a_flow_pool_a_speed_loras_sampler_and_clip_skip_are_left_out_and_its_steps_kept():
    """A FLUX.1 [schnell]-like pool (Euler flow alone, no CLIP skip, no guidance): an SDXL speed LoRA's settings
    that cannot apply are left out with a note each; its steps still apply (the UI's switch says the same)."""
    from engine.recommended import suggested_defaults
    from engine.requests import Limits, ModelDefaults
    from lora_catalog.hints import LoraHints
    from serving.ui.session import recommended

    schnell = ModelDefaults(
        steps=4,
        guidance=0.0,
        side=1024,
        max_side=2048,
        scheduler="FlowMatchEulerDiscreteScheduler",
        schedulers=("FlowMatchEulerDiscreteScheduler",),
        guidance_kind="none",
        negative_prompt=False,
        side_multiple=16,
    )
    where = "speed LoRA (Hyper-SD)"
    hints = LoraHints(
        speed="Hyper-SD",
        steps=8,
        guidance=3.5,
        sampler="DDIM trailing",
        clip_skip=1,
        sources=tuple((field, where) for field in ("steps", "guidance", "sampler", "clip_skip")),
    )
    suggested, notes = suggested_defaults([hints], schnell, Limits(max_loras=2, max_steps=60, max_prompt_chars=500))
    assert suggested is not None
    assert (suggested.steps, suggested.guidance, suggested.scheduler, suggested.clip_skip) == (8, None, None, None)
    assert suggested.sources == (("steps", where),)
    assert " | ".join(notes) == (
        f"{where} recommends the sampler 'DDIM trailing', which this pool does not offer | "
        f"{where} recommends CLIP skip 2 (A1111's count); this model takes none: not used | "
        f"{where} recommends guidance 3.5; this model takes none: not used"
    )
    assert recommended([hints], schnell, 60, True)[:4] == (8, 0.0, "", 1)


def test_a_request_is_normalised_and_checked_once_its_loras_defaults_filled_after(engine, repos, fixtures, monkeypatch):
    """LocalBackend checks a request before queueing it and queues what the check made: preparing it does not
    normalise it again, and the LoRAs' recommendations fill what the client left unset without a second pass."""
    import engine.pools.engine as engine_module
    import engine.recommended as recommended_module

    calls: list[str] = []

    def counted(module, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(engine_module, "normalise_request")
    counted(engine_module, "check_scheduler")
    if hasattr(recommended_module, "normalise_request"):
        counted(recommended_module, "normalise_request")
    plain = generate(engine, request(LoraSpec(fixtures["peft"], 0.8)))
    assert calls == ["normalise_request", "check_scheduler"]
    calls.clear()
    lcm = generate(engine, request(LoraSpec(repos["lcm"])))
    # The LoRA's sampler is a class of its own: built from the pool's config once it is known.
    assert calls == ["normalise_request", "check_scheduler", "check_scheduler"]
    assert (lcm.request.steps, lcm.request.sampler, plain.request.sampler) == (4, "LCM", engine.defaults.sampler)
    assert lcm.request.left_unset == ("steps", "guidance", "scheduler", "clip_skip", "guidance_2")
