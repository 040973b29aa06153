"""A scheduled run's step boundary rewrites only what the next segment changes (issue 51): the denoiser's weights
of the LoRAs whose scale changes there, never a text encoder's (they ran once, before step 0, at its scales) and
never the layers of a LoRA of the same request whose scale stays. Written weights are told by the fuse calls the
swap makes (by the weights' storage) and by the text encoders' values after the run; the base is bit-exact after."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import engine.weights.swap as swap_module
from engine.errors import GenerationCancelledError
from engine.requests import GenerateRequest, LoraSpec
from serving.demo.synthetic import TEXT_ATTENTION, find_targets, make_lora, peft_metadata, save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine

ENCODERS = ("text_encoder", "text_encoder_2")
# Over 4 steps: steps 0-1 at 1.0, steps 2-3 at 0 (the example): one boundary, before step 2.
SCHEDULE = ((0.0, 1.0), (0.5, 0.0))


def _write(folder: Path, name: str, pipe: Any, unet_pattern: str, seed: int) -> str:
    """A PEFT LoRA on the UNet modules matching `unet_pattern` and on both text encoders' attention."""
    components = {"unet": pipe.unet, **{c: getattr(pipe, c) for c in ENCODERS}}
    patterns = {"unet": (unet_pattern,), **dict.fromkeys(ENCODERS, TEXT_ATTENTION)}
    targets = find_targets(components, patterns)
    save_lora(folder / name, make_lora(targets, rank=4, seed=seed), peft_metadata(targets, rank=4, alpha=4))
    return f"local:{name}"


@pytest.fixture
def two_loras(loaded, tmp_path: Path) -> tuple[Path, str, str]:
    """A LoRA to schedule (the UNet's self-attention) and one at a constant scale (its cross-attention): disjoint
    UNet layers, the same text-encoder layers."""
    scheduled = _write(tmp_path, "scheduled.safetensors", loaded.pipe, r"attn1\.(to_q|to_v)$", seed=1)
    constant = _write(tmp_path, "constant.safetensors", loaded.pipe, r"attn2\.(to_q|to_out\.0)$", seed=2)
    return tmp_path, scheduled, constant


def _request(*loras: LoraSpec) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=loras, steps=4, width=64, height=64, seed=7)


def _names_by_storage(engine: Any) -> dict[int, str]:
    table = engine._table
    return {param.data_ptr(): name for param, name in zip(table.params, table.names, strict=True)}


def test_a_boundary_rewrites_only_the_scheduled_loras_denoiser_weights(
    loaded, pristine, base_settings, two_loras, monkeypatch
):
    folder, scheduled, constant = two_loras
    encoders = {c: getattr(loaded.pipe, c) for c in ENCODERS}
    with local_engine(loaded, base_settings.replace(local_lora_dir=folder), folder) as engine:
        # The same set at step 0's scales first: the scheduled request then swaps nothing before its run, so every
        # fuse during it is a boundary's.
        plain = _request(LoraSpec(scheduled, 1.0), LoraSpec(constant, 0.7))
        before = generate(engine, plain).image
        at_step_0 = {c: {n: p.detach().clone() for n, p in m.named_parameters()} for c, m in encoders.items()}
        storage = {c: {n: p.data_ptr() for n, p in m.named_parameters()} for c, m in encoders.items()}
        written: list[str] = []
        names = _names_by_storage(engine)
        fuse = swap_module.fuse

        def spy(weight: torch.Tensor, *args: Any) -> None:
            written.append(names[weight.data_ptr()])
            fuse(weight, *args)

        monkeypatch.setattr(swap_module, "fuse", spy)
        generate(engine, _request(LoraSpec(scheduled, schedule=SCHEDULE), LoraSpec(constant, 0.7)))
        monkeypatch.undo()

        assert written, "the boundary before step 2 must rewrite the scheduled LoRA's UNet weights"
        assert all(name.startswith("unet.") and ".attn1." in name for name in written), sorted(set(written))
        assert len(written) == len(set(written)), "each changed weight is written once"
        for component, module in encoders.items():
            for name, param in module.named_parameters():
                assert param.data_ptr() == storage[component][name], f"{component}.{name} was replaced"
                assert torch.equal(param, at_step_0[component][name]), f"{component}.{name} changed at a boundary"
        # The run left the pool mixed (UNet at the last segment, encoders at step 0): the next request swaps in
        # full and makes the image it made before.
        assert generate(engine, plain).image.tobytes() == before.tobytes()
        engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", *ENCODERS))


def test_a_run_cancelled_after_a_partial_boundary_leaves_the_pool_serving_what_it_served(
    loaded, pristine, base_settings, two_loras
):
    folder, scheduled, constant = two_loras
    with local_engine(loaded, base_settings.replace(local_lora_dir=folder), folder) as engine:
        served = _request(LoraSpec(constant, 0.7))
        before = generate(engine, served).image
        fused = engine._fused.identity()
        cancel = threading.Event()

        def progress(step: int, total: int) -> None:
            if step == 3:  # the boundary before step 2 was made, and step 2 ran on it
                cancel.set()

        with pytest.raises(GenerationCancelledError):
            request = _request(LoraSpec(scheduled, schedule=SCHEDULE), LoraSpec(constant, 0.7))
            generate(engine, request, progress=progress, cancel=cancel)
        assert engine._fused.identity() == fused
        assert generate(engine, served).image.tobytes() == before.tobytes()
        engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", *ENCODERS))
