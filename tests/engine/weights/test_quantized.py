"""A quantized pool (QUANTIZE=fp8): the tiny FLUX's transformer in fp8 with its LoRAs as low-rank branches.

References are diffusers' own: the same tiny FLUX quantized by torchao's `Float8WeightOnlyConfig` (the same bytes),
each LoRA loaded unfused (`load_lora_weights` + `set_adapters`, no `fuse_lora`), within 2 levels; the stored
weights byte for byte after runs with failures; what a branch cannot hold refused with a 4xx, the previous set
still serving.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline
from safetensors.torch import save_file

from engine.errors import GenerationError, LimitExceededError, UnsupportedLoraVariantError
from engine.pipeline.compiled import dynamo_compiles
from engine.pipeline.loading import load_pipeline, warm_up
from engine.pools.plan import pipeline_modules
from engine.pools.residency import Residency, module_bytes
from engine.requests import GenerateRequest, LoraSpec
from engine.weights.quantized import BranchedLinear, held_branches, stored_bytes
from families.flux import MODEL_ID as FLUX_MODEL_ID
from serving.demo.synthetic import save_lora
from serving.demo.synthetic_flux import flux_layers, make_flux_lora
from tests.support.checks import generate
from tests.support.dit import PROMPT, local_engine, pixels
from tests.support.flux import CASES, write_flux_loras
from tests.support.images import LEVELS, assert_images_close, level_difference

torchao = pytest.importorskip("torchao")  # requirements.txt pins it; a venv without it skips, never fails

RANK = 8  # LORA_MAX_RANK of these pools: the cases are rank 4, two of them fill a branch


def request(*loras: LoraSpec, seed: int = 7, steps: int = 3) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=tuple(loras), steps=steps, guidance=3.5, width=64, height=64, seed=seed)


@pytest.fixture(scope="module")
def settings(base_settings, tiny_flux_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8-loras")
    return base_settings.replace(
        model_id=str(tiny_flux_dir),
        base_model_id=FLUX_MODEL_ID,
        quantize="fp8",
        lora_max_rank=RANK,
        local_lora_dir=folder,
    )


@pytest.fixture(scope="module")
def fp8_flux(settings):
    return load_pipeline(settings)


@pytest.fixture(scope="module")
def loras(fp8_flux, loaded_flux, settings) -> Path:
    folder = settings.local_lora_dir
    write_flux_loras(loaded_flux.pipe, folder)  # from the unquantized twin: the same module names and shapes
    wide = make_flux_lora(flux_layers(loaded_flux.pipe.transformer), rank=16, seed=41, alpha=16.0)
    save_lora(folder / "rank16.safetensors", wide.twin())
    # A LoHa (PEFT's names) on one of the transformer's linears: its ΔW has no rank-r form.
    generator = torch.Generator().manual_seed(42)
    out, inp = loaded_flux.pipe.transformer.x_embedder.weight.shape
    loha = {
        f"transformer.x_embedder.{name}": torch.randn(shape, generator=generator) * 0.1
        for name, shape in (
            ("hada_w1_a", (out, 2)),
            ("hada_w1_b", (2, inp)),
            ("hada_w2_a", (out, 2)),
            ("hada_w2_b", (2, inp)),
        )
    }
    save_file(loha, folder / "loha.safetensors")
    return folder


@pytest.fixture(scope="module")
def reference(tiny_flux_dir):
    """diffusers' pipeline from the same folder, its transformer quantized by torchao, LoRAs loaded unfused."""
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    pipe.set_progress_bar_config(disable=True)
    quantize_(pipe.transformer, Float8WeightOnlyConfig())
    return pipe


def reference_image(pipe, folder: Path, weight_name: str | None, scale: float) -> np.ndarray:
    if weight_name is not None:
        with warnings.catch_warnings():
            # PEFT warns that such a layer cannot merge: the reference never merges (it is the unfused one).
            warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
            pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.set_adapters(["a0"], adapter_weights=[scale])
    try:
        generator = torch.Generator("cpu").manual_seed(7)
        image = pipe(
            prompt=PROMPT, num_inference_steps=3, guidance_scale=3.5, width=64, height=64, generator=generator
        ).images[0]
    finally:
        if weight_name is not None:
            pipe.unload_lora_weights()
    return pixels(image)


@pytest.fixture(scope="module")
def engine(fp8_flux, settings, loras):
    with local_engine(fp8_flux, settings, loras) as made:
        yield made


def test_every_linear_is_stored_in_fp8_with_torchaos_bytes(fp8_flux, reference):
    ours = {n: m for n, m in fp8_flux.pipe.transformer.named_modules() if isinstance(m, BranchedLinear)}
    theirs = {n: m.weight for n, m in reference.transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    assert ours.keys() == theirs.keys() and len(ours) > 20
    for name, module in ours.items():
        assert module.weight.dtype == torch.float8_e4m3fn and module.lora_down.shape[0] == RANK
        assert torch.equal(module.weight, theirs[name].qdata) and torch.equal(module.weight_scale, theirs[name].scale)
    assert fp8_flux.storage == "fp8" and fp8_flux.branch_rank == RANK


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_flux_lora_naming_equals_diffusers_unfused_on_the_same_fp8_model(engine, loras, reference, case):
    base = pixels(generate(engine, request()).image)
    ours = pixels(generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.8))).image)
    theirs = reference_image(reference, loras, case.reference_name, 0.8)
    assert np.abs(theirs - base).mean() > 2, "the LoRA must visibly change the image"
    assert_images_close(ours, theirs)


def test_without_a_lora_the_image_is_diffusers_own_on_the_fp8_model(engine, loras, reference):
    assert_images_close(pixels(generate(engine, request()).image), reference_image(reference, loras, None, 1.0))


def test_a_scheduled_lora_changes_only_the_branch_scales_at_its_boundaries_as_diffusers_unfused(
    engine, loras, reference, fp8_flux, monkeypatch
):
    """A LoRA's strength by step (issue 51) on a quantized pool: at a boundary the branches keep their factors and
    take the next segment's scale; the image is diffusers' unfused LoRA with its weight set in
    `callback_on_step_end` at the same steps (0, 0, 2, 2 over 4 steps: `[[0, 0], [0.5, 2]]`)."""
    case = CASES[0]
    spec = LoraSpec(f"local:{case.file_name}", schedule=((0.0, 0.0), (0.5, 2.0)))
    generate(engine, request(LoraSpec(spec.ref, 0.0), steps=4))  # the factors held at the step-0 scale
    loads: list[str] = []
    for name in ("load_branch", "load_scales"):
        method = getattr(BranchedLinear, name)
        monkeypatch.setattr(
            BranchedLinear, name, lambda self, parts, m=method, n=name: (loads.append(n), m(self, parts))
        )
    ours = pixels(generate(engine, request(spec, steps=4)).image)
    assert "load_scales" in loads and "load_branch" not in loads  # the boundary wrote scales, no factors
    plain = pixels(generate(engine, request(LoraSpec(spec.ref, 0.0), steps=4)).image)
    weights = (0.0, 0.0, 2.0, 2.0)

    def at_step_end(pipe, step, timestep, kwargs):
        if step + 1 < len(weights):
            pipe.set_adapters(["a0"], adapter_weights=[weights[step + 1]])
        return kwargs

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        reference.load_lora_weights(str(loras), weight_name=case.reference_name, adapter_name="a0")
    try:
        reference.set_adapters(["a0"], adapter_weights=[weights[0]])
        theirs = reference(
            prompt=PROMPT,
            num_inference_steps=4,
            guidance_scale=3.5,
            width=64,
            height=64,
            generator=torch.Generator("cpu").manual_seed(7),
            callback_on_step_end=at_step_end,
        ).images[0]
    finally:
        reference.unload_lora_weights()
    assert_images_close(ours, pixels(theirs))
    assert level_difference(ours, plain) > LEVELS, "the schedule must change the image"


def test_a_lora_over_the_branch_rank_is_refused_naming_the_limit_and_the_previous_set_still_serves(engine):
    served = request(LoraSpec("local:flux_peft.safetensors"), seed=3, steps=1)
    before = generate(engine, served).image.tobytes()
    with pytest.raises(
        LimitExceededError, match=r"'rank16.safetensors' rank 16\] needs rank 16 .*\(LORA_MAX_RANK=8\)"
    ) as caught:
        generate(engine, request(LoraSpec("local:rank16.safetensors"), steps=1))
    assert caught.value.status == 400
    three = [LoraSpec(f"local:flux_{name}.safetensors") for name in ("peft", "kohya", "comfy")]
    with pytest.raises(LimitExceededError, match=r"needs rank 12 together .* accepted: LoRAs whose ranks sum to"):
        generate(engine, request(*three, steps=1))
    again = generate(engine, served)
    assert not again.swapped and again.image.tobytes() == before  # still the set it served: no swap needed
    two = generate(engine, request(*three[:2], steps=1))  # rank 4 + 4 fills a branch of 8 exactly
    assert two.swapped


def test_a_loha_on_the_denoiser_is_refused_naming_what_a_quantized_pool_takes(engine):
    with pytest.raises(
        UnsupportedLoraVariantError,
        match=r"is a LoHa, LoKr or DoRA on the denoiser .* accepted there: plain LoRA and LoCon",
    ):
        generate(engine, request(LoraSpec("local:loha.safetensors"), steps=1))


def test_the_stored_weights_are_byte_identical_after_swaps_and_failures(engine, fp8_flux):
    transformer = fp8_flux.pipe.transformer
    before = stored_bytes(transformer)
    base = generate(engine, request(steps=1)).image.tobytes()
    for index, case in enumerate((*CASES, *CASES)):
        generate(engine, request(LoraSpec(f"local:{case.file_name}", scale=0.5 + index / 10), steps=1))
        if index % 3 == 1:
            with pytest.raises((LimitExceededError, UnsupportedLoraVariantError)):
                bad = "rank16" if index % 2 else "loha"
                generate(engine, request(LoraSpec(f"local:{bad}.safetensors"), steps=1))
    assert stored_bytes(transformer) == before
    assert generate(engine, request(steps=1)).image.tobytes() == base
    assert held_branches(transformer) == []
    generate(engine, request(LoraSpec("local:flux_peft.safetensors"), steps=1))
    engine.restore_base_weights()
    assert held_branches(transformer) == [] and stored_bytes(transformer) == before


@pytest.fixture(scope="module")
def compiled_fp8(settings):
    """A quantized pipeline of its own compiled for one size with dynamo's `aot_eager` (as tests/engine/pipeline/
    test_compiled.py compiles the SDXL one)."""
    compiled_settings = settings.replace(compile="default")
    loaded = warm_up(
        load_pipeline(compiled_settings, warm=False), compiled_settings, backend="aot_eager", sizes=[(64, 64)]
    )
    yield loaded
    assert loaded.compiled is not None
    loaded.compiled.remove()


def test_branch_swaps_recompile_nothing_and_equal_eager(compiled_fp8, settings, loras, engine):
    compiled = compiled_fp8.compiled
    assert compiled is not None and compiled.shapes == 1
    names = [case.file_name for case in CASES]
    sets = [
        (names[i % len(names)],) if i % 3 else (names[i % len(names)], names[(i + 1) % len(names)]) for i in range(8)
    ]
    requests = [
        request(*(LoraSpec(f"local:{n}", scale=0.6 + 0.1 * i) for n in refs), steps=2) for i, refs in enumerate(sets)
    ]
    with local_engine(compiled_fp8, settings.replace(compile="default"), loras) as compiled_engine:
        before = dynamo_compiles()
        with torch._dynamo.config.patch(error_on_recompile=True):
            results = [generate(compiled_engine, r) for r in (*requests, request(steps=2))]
    assert dynamo_compiles() == before and compiled.recompiles == 0 and compiled.eager_calls == 0
    assert all(r.swapped for r in results)
    for one, result in zip((*requests, request(steps=2)), results, strict=True):
        assert_images_close(result, generate(engine, one), one)


def test_a_quantized_pool_moved_out_and_back_serves_the_same_bytes_and_keeps_its_stored_weights(fp8_flux, engine):
    """The residency moves a pool through one flat buffer (`engine.pools.flat`): the fp8 weights, their scales and
    the branch buffers move with it, and a swap after the move writes the buffers the model reads."""
    served = request(LoraSpec("local:flux_kohya.safetensors", scale=0.7), steps=1)
    other = request(LoraSpec("local:flux_comfy.safetensors"), steps=1)
    expected = [generate(engine, r).image for r in (served, other, served)]
    before = stored_bytes(fp8_flux.pipe.transformer)
    residency = Residency(torch.device("cpu"), module_bytes(pipeline_modules(fp8_flux)))
    residency.add("fp8", pipeline_modules(fp8_flux), before_leaving=engine.prepare_to_leave_device)
    residency.add("other", [torch.nn.Linear(64, 64)], before_leaving=lambda: None)
    first = fp8_flux.pipe.transformer.x_embedder.weight
    pointers, got = {first.data_ptr()}, []
    for one in (served, other, served):
        with residency.use("other"):
            pass
        with residency.use("fp8") as moved_s:
            assert moved_s > 0
            pointers.add(first.data_ptr())
            got.append(generate(engine, one).image)
    assert len(pointers) > 1 and first.dtype == torch.float8_e4m3fn
    for image, reference in zip(got, expected, strict=True):
        assert_images_close(image, reference)  # other storage after a move: within 2 levels, not bit for bit
    assert stored_bytes(fp8_flux.pipe.transformer) == before


def test_a_branch_swap_failing_half_way_leaves_no_lora_on_the_padded_formula(
    compiled_fp8, settings, loras, monkeypatch
):
    """A copy raising half-way through a branch swap (injected): later requests without a LoRA are the base, bit
    for bit, on the compiled pipeline's padded formula (which reads every branch buffer, whatever `branch_rank`
    says), and every branch is zero. Branches written before the failure used to stay active (up to 21 levels)."""
    import engine.weights.quantized as quantized

    copy, calls = quantized._copy, []

    def fails(target: torch.Tensor, source: torch.Tensor | float) -> None:
        calls.append(1)
        if len(calls) == 9:  # the fifth module's, the four before it written
            raise RuntimeError("injected copy failure")
        copy(target, source)

    compiled_settings = settings.replace(compile="default")
    with local_engine(compiled_fp8, compiled_settings, loras) as compiled_engine:
        base = generate(compiled_engine, request(steps=1)).image.tobytes()
        monkeypatch.setattr(quantized, "_copy", fails)
        with pytest.raises(GenerationError, match="the request failed") as failed:
            generate(compiled_engine, request(LoraSpec("local:flux_kohya.safetensors", scale=0.7), steps=1))
        assert "injected copy failure" in str(failed.value.__cause__)
        monkeypatch.setattr(quantized, "_copy", copy)
        for _ in range(2):
            assert generate(compiled_engine, request(steps=1)).image.tobytes() == base
    assert held_branches(compiled_fp8.pipe.transformer) == []
