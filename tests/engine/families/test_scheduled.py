"""A scheduled LoRA (its strength by step) against diffusers: the LoRA loaded through PEFT unfused, its adapter
weight set in `callback_on_step_end` at the same boundaries, within 2 levels per channel, on the tiny SDXL, FLUX.1
and Wan pipelines (issue 51, item 2), and on the tiny Wan 2.2 A14B pair, each side its own schedule or the pair's
(each transformer its own adapter, each weight set there); the base bit-exact after; a cancelled scheduled run
leaves the pool serving exactly what it served. The weights each step runs at are written out here, from the
issue's rule, not computed by the engine's own reading of it (`engine.schedules.scale_at`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusionXLPipeline, WanPipeline

from engine.errors import GenerationCancelledError
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.entries import Family
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.flux import CASES as FLUX_CASES
from tests.support.flux import write_flux_loras
from tests.support.images import LEVELS, assert_images_close, level_difference
from tests.support.wan import CASES as WAN_CASES
from tests.support.wan import FRAMES, write_wan_loras

PROMPT = "a photo of a cat in sks style"
# Over 4 steps: steps 0-1 at 1.0, steps 2-3 at 0 (the example).
SCHEDULE = ((0.0, 1.0), (0.5, 0.0))
# Late steps change a tiny model's image least: these schedules change it most there, so that a run which left
# the step-0 scale on throughout would be told apart. Steps 0-1 at 0, steps 2-3 at 2.0 (and its short form).
LATE = ((0.0, 0.0), (0.5, 2.0))
LATE_WEIGHTS = (0.0, 0.0, 2.0, 2.0)
# Three segments: 0.3 for step 0, -1.0 for steps 1-2, 2.0 for step 3.
THREE = ((0.0, 0.3), (0.25, -1.0), (0.75, 2.0))
THREE_WEIGHTS = (0.3, -1.0, -1.0, 2.0)


def peft_scheduled(pipe: Any, load: dict[str, Any], weights: Sequence[float], **call: Any) -> Any:
    """diffusers' run with the LoRA loaded unfused (PEFT) as adapter `a0`, its weight `weights[0]` before the run
    (the text encoders' too) and `weights[i + 1]` set in `callback_on_step_end` after step i."""
    pipe.load_lora_weights(adapter_name="a0", **load)
    return run_setting_weights(
        pipe, len(weights), lambda step: pipe.set_adapters(["a0"], adapter_weights=[weights[step]]), **call
    )


def run_setting_weights(pipe: Any, steps: int, set_weights: Callable[[int], None], **call: Any) -> Any:
    """diffusers' run of `steps` steps at 64 px, seed 7, with `set_weights(0)` before it and `set_weights(i + 1)`
    in `callback_on_step_end` after step i."""
    pipe.set_progress_bar_config(disable=True)
    set_weights(0)

    def at_step_end(pipe: Any, step: int, timestep: object, kwargs: dict) -> dict:
        if step + 1 < steps:
            set_weights(step + 1)
        return kwargs

    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(
        prompt=PROMPT,
        num_inference_steps=steps,
        width=64,
        height=64,
        generator=generator,
        callback_on_step_end=at_step_end,
        **call,
    )


def assert_close_and_scheduled(ours: Any, theirs: Any, plain: Any, what: str) -> None:
    """`ours` is diffusers' scheduled image within 2 levels, and `plain` (the step-0 scale throughout) is not."""
    assert_images_close(pixels(ours), pixels(theirs), what)
    assert level_difference(pixels(ours), pixels(plain)) > LEVELS, f"{what}: the schedule must change the image"


# -- SDXL --------------------------------------------------------------------------------------------------------


def sdxl_request(*loras: LoraSpec, steps: int = 4) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=loras, steps=steps, width=64, height=64, seed=7)


@pytest.mark.parametrize(
    ("spec", "weights"),
    [
        (LoraSpec("", schedule=LATE), LATE_WEIGHTS),
        (LoraSpec("", 2.0, start=0.5), LATE_WEIGHTS),
        (LoraSpec("", schedule=THREE), THREE_WEIGHTS),
    ],
    ids=["schedule", "start-end", "three-segments"],
)
def test_sdxl_scheduled_equals_peft_with_weights_set_at_step_end(
    engine, fixtures, tiny_dir, loaded, pristine, spec, weights
):
    repo = fixtures["peft"]
    spec = LoraSpec(repo, spec.scale, schedule=spec.schedule, start=spec.start, end=spec.end)
    ours = generate(engine, sdxl_request(spec)).image
    plain = generate(engine, sdxl_request(LoraSpec(repo, weights[0]))).image
    load = {"pretrained_model_name_or_path_or_dict": repo, "weight_name": "pytorch_lora_weights.safetensors"}
    theirs = peft_scheduled(StableDiffusionXLPipeline.from_pretrained(tiny_dir), load, weights).images[0]
    assert_close_and_scheduled(ours, theirs, plain, "sdxl")
    engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))


def test_a_cancelled_scheduled_run_leaves_the_pool_serving_what_it_served(engine, fixtures, loaded, pristine):
    served = LoraSpec(fixtures["kohya"], 0.8, weight_name="ohwx_style.safetensors")
    before = generate(engine, sdxl_request(served)).image
    fused = engine._fused.identity()
    cancel = threading.Event()
    seen: list[int] = []

    def progress(step: int, total: int) -> None:
        seen.append(step)
        if step == 2:  # after the boundary into the schedule's second segment is due
            cancel.set()

    scheduled = sdxl_request(LoraSpec(fixtures["peft"], schedule=SCHEDULE))
    with pytest.raises(GenerationCancelledError):
        generate(engine, scheduled, progress=progress, cancel=cancel)
    assert 2 in seen and 4 not in seen
    assert engine._fused.identity() == fused
    assert generate(engine, sdxl_request(served)).image.tobytes() == before.tobytes()
    engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))


# -- FLUX.1 and Wan ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flux_lora(loaded_flux, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("flux-scheduled")
    case = FLUX_CASES[0]  # PEFT names, a CLIP part too
    write_flux_loras(loaded_flux.pipe, folder, cases=(case,))
    return folder, case.file_name


def test_flux_scheduled_equals_peft_with_weights_set_at_step_end(
    family_engine, flux_lora, tiny_flux_dir, loaded_flux, pristine_flux
):
    folder, name = flux_lora
    engine = family_engine(Family.FLUX, folder)
    flux = {"prompt": PROMPT, "steps": 4, "guidance": 3.5, "width": 64, "height": 64, "seed": 7}
    ours = generate(engine, GenerateRequest(loras=(LoraSpec(f"local:{name}", schedule=THREE),), **flux)).image
    plain = generate(engine, GenerateRequest(loras=(LoraSpec(f"local:{name}", 0.3),), **flux)).image
    load = {"pretrained_model_name_or_path_or_dict": str(folder), "weight_name": name}
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    theirs = peft_scheduled(pipe, load, THREE_WEIGHTS, guidance_scale=3.5).images[0]
    assert_close_and_scheduled(ours, theirs, plain, "flux")
    engine.restore_base_weights()
    assert_components_pristine(loaded_flux.pipe, pristine_flux, ("transformer", "text_encoder"))


@pytest.fixture(scope="module")
def wan_lora(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("wan-scheduled")
    case = WAN_CASES[0]  # PEFT names
    write_wan_loras(loaded_wan.pipe, folder, cases=(case,))
    return folder, case.file_name


def test_wan_scheduled_equals_peft_with_weights_set_at_step_end(
    family_engine, wan_lora, tiny_wan_dir, loaded_wan, pristine_wan
):
    folder, name = wan_lora
    engine = family_engine(Family.WAN, folder)
    wan = {"prompt": PROMPT, "steps": 4, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES}
    ours = generate(engine, GenerateRequest(loras=(LoraSpec(f"local:{name}", schedule=LATE),), **wan))
    plain = generate(engine, GenerateRequest(loras=(LoraSpec(f"local:{name}", 0.0),), **wan))
    load = {"pretrained_model_name_or_path_or_dict": str(folder), "weight_name": name}
    pipe = WanPipeline.from_pretrained(tiny_wan_dir)
    theirs = peft_scheduled(pipe, load, LATE_WEIGHTS, guidance_scale=5.0, num_frames=FRAMES, output_type="pil")
    frames = list(theirs.frames[0])
    for index, (mine, reference) in enumerate(zip(ours.frames, frames, strict=True)):
        assert_images_close(pixels(mine), pixels(reference), f"wan frame {index}")
    assert level_difference(pixels(ours.frames[-1]), pixels(plain.frames[-1])) > LEVELS, "the schedule must tell"
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan.pipe, pristine_wan, ("transformer",))


# -- Wan 2.2 A14B: each side its own schedule, or the pair's -------------------------------------------------------

# Over 8 steps the tiny A14B's high-noise transformer runs steps 0-2 (timesteps 999, 954, 900: at least its
# boundary, 875) and the low-noise one steps 3-7, so each side's schedule changes inside the steps it runs.
A14B_STEPS = 8
# Each side its own: the high-noise side 0 at step 0 and 2.0 after; the low-noise side 1.0 to step 3, then -1.0.
HIGH = ((0.0, 0.0), (0.125, 2.0))
LOW = ((0.0, 1.0), (0.5, -1.0))
OWN_WEIGHTS = ((0.0,) + (2.0,) * 7, (1.0,) * 4 + (-1.0,) * 4)
# The pair's: 0 for steps 0-1, 2.0 for steps 2-5, -1.0 for steps 6-7, on both sides.
PAIRS = ((0.0, 0.0), (0.25, 2.0), (0.75, -1.0))
PAIRS_WEIGHTS = ((0.0,) * 2 + (2.0,) * 4 + (-1.0,) * 2,) * 2


@pytest.fixture(scope="module")
def wan22_lora(loaded_wan22, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("wan22-scheduled")
    case = WAN_CASES[0]  # PEFT names; one file on both transformers
    write_wan_loras(loaded_wan22.pipe, folder, cases=(case,))
    return folder, case.file_name


def peft_scheduled_sides(pipe: Any, folder: Path, name: str, weights: Sequence[Sequence[float]]) -> list:
    """diffusers' A14B video with the file loaded unfused (PEFT) into `transformer` and, with
    `load_into_transformer_2=True`, into `transformer_2`, each its own adapter, whose weights at step i are
    `weights[0][i]` and `weights[1][i]`, set as `run_setting_weights` sets them; the pool's CFG (4, then 3)."""
    sides = ("transformer", "transformer_2")
    for side in sides:
        low = {"load_into_transformer_2": True} if side == "transformer_2" else {}
        pipe.load_lora_weights(str(folder), weight_name=name, adapter_name=side, **low)

    def set_weights(step: int) -> None:
        for side, side_weights in zip(sides, weights, strict=True):
            getattr(pipe, side).set_adapters([side], weights=[side_weights[step]])

    call = {"guidance_scale": 4.0, "guidance_scale_2": 3.0, "num_frames": FRAMES, "output_type": "pil"}
    return list(run_setting_weights(pipe, A14B_STEPS, set_weights, **call).frames[0])


@pytest.mark.parametrize(
    ("spec", "weights", "plains"),
    [
        (
            LoraSpec("", schedule=HIGH, schedule_2=LOW),
            OWN_WEIGHTS,
            # Step 0's scales throughout; and the low-noise side at its step-0 scale throughout.
            (LoraSpec("", 0.0, scale_2=1.0), LoraSpec("", schedule=HIGH, scale_2=1.0)),
        ),
        (
            LoraSpec("", schedule=PAIRS),
            PAIRS_WEIGHTS,
            # Step 0's scale throughout; and the pair's schedule on the high-noise side alone.
            (LoraSpec("", 0.0), LoraSpec("", schedule=PAIRS, scale_2=0.0)),
        ),
    ],
    ids=["own-schedules", "the-pairs-schedule"],
)
def test_a_wan_a14b_pair_scheduled_equals_peft_with_each_sides_weight_set_at_step_end(
    family_engine, wan22_lora, tiny_wan22_dir, loaded_wan22, pristine_wan22, spec, weights, plains
):
    folder, name = wan22_lora
    engine = family_engine(Family.WAN22, folder)
    path = f"local:{name}"
    wan: dict[str, Any] = {
        "prompt": PROMPT,
        "steps": A14B_STEPS,
        "width": 64,
        "height": 64,
        "seed": 7,
        "num_frames": FRAMES,
    }

    def run(lora: LoraSpec) -> Any:
        lora = LoraSpec(path, lora.scale, scale_2=lora.scale_2, schedule=lora.schedule, schedule_2=lora.schedule_2)
        return generate(engine, GenerateRequest(loras=(lora,), **wan))

    ours = run(spec)
    theirs = peft_scheduled_sides(WanPipeline.from_pretrained(tiny_wan22_dir), folder, name, weights)
    for index, (mine, reference) in enumerate(zip(ours.frames, theirs, strict=True)):
        assert_images_close(pixels(mine), pixels(reference), f"wan 2.2 frame {index}")
    for plain in plains:
        other = run(plain).frames[-1]
        assert level_difference(pixels(ours.frames[-1]), pixels(other)) > LEVELS, f"{plain}: the schedule must tell"
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, ("transformer", "transformer_2", "text_encoder"))
