"""A scheduled LoRA in a recipe: Forge's `<lora:name:1.0:start=0:end=0.25>` tag, written and read back into the
same checked LoRAs (issue 51)."""

from __future__ import annotations

import dataclasses

from PIL import Image

from engine.normalise import normalise_loras
from engine.requests import AdapterUse, CheckedRequest, GenerateResult, LoraSpec, Timings
from serving.recipes import parse_recipe, recipe_text

SPECS = (
    LoraSpec("owner/sda", 1.0, start=0, end=0.25),
    LoraSpec("owner/late", 0.7, start=0.5),
    LoraSpec("owner/middle", 0.6, start=0.25, end=0.75),
    LoraSpec("owner/ramp", schedule=((0, 0.4), (0.5, 0.9), (0.75, -0.25))),
    LoraSpec("local:styles/ink.safetensors", -0.5),
)


def scheduled_result() -> GenerateResult:
    checked = normalise_loras(SPECS, 8)
    uses = tuple(AdapterUse(s.ref, "", "", s.scale, "hit") for s in checked)
    request = CheckedRequest(prompt="a fox", loras=checked, steps=8, guidance=5.0, width=64, height=64, seed=3)
    image = Image.new("RGB", (64, 64))
    return GenerateResult(image=image, seed=3, request=request, timings=Timings(), adapters=uses)


def test_a_schedule_is_written_in_forges_tag_form():
    prompt = recipe_text(scheduled_result()).split("\n")[0]
    assert prompt == (
        "a fox <lora:owner/sda:1:start=0:end=0.25> <lora:owner/late:0.7:start=0.5> "
        "<lora:owner/middle:0.6:start=0.25:end=0.75> <lora:owner/ramp:0.4:schedule=0@0.4;0.5@0.9;0.75@-0.25> "
        "<lora:~styles/ink.safetensors:-0.5>"
    )


def test_a_scheduled_recipe_reads_back_into_the_same_checked_loras():
    made = scheduled_result()
    read = parse_recipe(recipe_text(made)).request
    assert read.prompt == "a fox"
    assert normalise_loras(read.loras, 8) == made.request.loras
    # The tag as Forge proposes it, written by hand, reads the same way.
    forge = parse_recipe("a fox <lora:owner/sda:1.0:start=0:end=0.25>\nSteps: 8, Seed: 3, Size: 64x64").request
    assert normalise_loras(forge.loras, 8) == (dataclasses.replace(made.request.loras[0]),)
