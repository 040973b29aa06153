"""Wan's speed LoRAs on the tiny Wan pools: a lightx2v step- and CFG-distilled file, named as lightx2v and Kijai
publish them, brings its 4 steps and guidance 1 (no CFG) where the client set nothing, on both stages of Wan 2.2
A14B (`guidance_2`); the run equals the same request with those settings given, and the result says where they
came from. A client's own settings win."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.entries import Family
from serving.recipes import recipe_text
from tests.support.checks import generate
from tests.support.dit import pixels
from tests.support.wan import CASES, PROMPT, write_wan_loras

SPEED = "Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors"


def speed_dir(loaded, folder: Path) -> Path:
    """The speed LoRA's folder for one tiny pool (Wan 2.1's tiny transformer is narrower than A14B's)."""
    if not (folder / SPEED).exists():
        write_wan_loras(loaded.pipe, folder, CASES[:1])
        (folder / CASES[0].file_name).rename(folder / SPEED)
    return folder


def request(**fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "width": 64, "height": 64, "seed": 7, "num_frames": 5} | fields
    return GenerateRequest(loras=(LoraSpec(f"local:{SPEED}", scale=0.8),), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", [Family.WAN22, Family.WAN])
def test_a_lightx2v_lora_brings_its_steps_and_no_cfg_where_the_client_set_none(
    family_engine, tiny_models, tmp_path, family
):
    engine = family_engine(family, speed_dir(tiny_models.loaded(family), tmp_path))
    offered = generate(engine, request())
    sources = dict(offered.request.defaults_from)
    assert (offered.request.steps, offered.request.guidance) == (4, 1.0)
    assert "speed LoRA (Wan-Lightx2v" in sources["steps"] and "from its name" in sources["guidance"]
    two_stage = family is Family.WAN22
    assert offered.request.guidance_2 == (1.0 if two_stage else None)
    assert ("guidance_2" in sources) is two_stage
    assert "Steps: 4" in recipe_text(offered) and "CFG scale: 1" in recipe_text(offered)
    explicit = {"steps": 4, "guidance": 1.0} | ({"guidance_2": 1.0} if two_stage else {})
    given = generate(engine, request(**explicit))
    assert given.request.defaults_from == ()
    for ours, theirs in zip(offered.frames, given.frames, strict=True):
        assert (pixels(ours) == pixels(theirs)).all()


def test_the_clients_own_settings_win_over_a_speed_loras(family_engine, loaded_wan22, tmp_path):
    engine = family_engine(Family.WAN22, speed_dir(loaded_wan22, tmp_path))
    mine = generate(engine, request(steps=2, guidance=3.0, guidance_2=2.0))
    assert (mine.request.steps, mine.request.guidance, mine.request.guidance_2) == (2, 3.0, 2.0)
    assert mine.request.defaults_from == ()
