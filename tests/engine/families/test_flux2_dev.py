"""FLUX.2 [dev] on the tiny [dev] pipeline (Flux2Pipeline, a Mistral3 encoder): every LoRA naming diffusers'
`Flux2LoraLoaderMixin` reads (klein's cases, tests/support/flux2.py) against its load_lora_weights + fuse_lora;
[dev]'s and klein's LoRAs (the same names) told apart by card, metadata, Civitai's label and their hidden width,
each refused by the other's pool naming the family; the defaults; previews; the base bit-exact after failures.
Everything the family needs is engine/families/flux2_dev.py, its tiny builder and families/flux2_dev.py.
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/swaps.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from diffusers import Flux2Pipeline
from safetensors.torch import load_file

from engine.errors import IncompatibleLoraError
from engine.families.flux2_dev import FAMILY, tokenizer_without_torchvision
from engine.families.origin import check_origin, judge_origin
from engine.families.registry import family_spec
from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, LoraSpec
from families.flux2 import MODEL_ID as KLEIN
from families.flux2_dev import MODEL_ID
from lora_catalog.bases import family_from_metadata
from lora_catalog.civitai.bases import civitai_base
from lora_catalog.entries import Family
from tests.engine.families.test_flux2 import kohya_mlp_shapes
from tests.support.checks import generate
from tests.support.dit import PROMPT, local_engine, pipeline_image, preview_frames
from tests.support.flux2 import CASES, write_flux2_loras
from tests.support.images import assert_images_close

KLEIN_LORA = "klein_aitk.safetensors"


def request(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, loras=tuple(loras), steps=3, width=64, height=64, seed=seed)


@pytest.fixture(scope="module")
def dev_loras(loaded_flux2_dev, loaded_flux2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each naming's file for the tiny [dev], and a klein LoRA (ai-toolkit's names) for the tiny klein."""
    folder = tmp_path_factory.mktemp("flux2-dev-loras")
    write_flux2_loras(loaded_flux2_dev.pipe, folder)
    apart = tmp_path_factory.mktemp("klein-lora")
    klein = write_flux2_loras(loaded_flux2.pipe, apart, cases=[c for c in CASES if c.name == "aitk"])
    (apart / klein["aitk"].file_name).rename(folder / KLEIN_LORA)
    return folder


@pytest.fixture(scope="module")
def dev_engine(loaded_flux2_dev, pristine_flux2_dev, base_settings, dev_loras):
    """One engine for the module (its pristine copy taken before any swap)."""
    settings = base_settings.replace(local_lora_dir=dev_loras, base_model_id=MODEL_ID)
    with local_engine(loaded_flux2_dev, settings, dev_loras) as engine:
        yield engine


def test_the_tiny_dev_has_flux2_devs_structure(loaded_flux2_dev):
    pipe = loaded_flux2_dev.pipe
    assert type(pipe) is Flux2Pipeline and loaded_flux2_dev.family is FAMILY and family_spec(MODEL_ID) is FAMILY
    assert type(pipe.text_encoder).__name__ == "Mistral3ForConditionalGeneration"
    # Flux2Pipeline reads Mistral's hidden states 10, 20 and 30.
    assert pipe.text_encoder.config.text_config.num_hidden_layers > 30
    config = pipe.transformer.config
    assert config.num_attention_heads * config.attention_head_dim == 88 and config.guidance_embeds
    defaults = loaded_flux2_dev.defaults
    assert (defaults.side, defaults.guidance_kind, defaults.negative_prompt) == (64, "distilled", False)
    assert loaded_flux2_dev.components == ("transformer",) and defaults.side_multiple == 4
    # A request with an image is a reference edit on Flux2Pipeline itself (up to BFL's 6): no inpainting class.
    assert defaults.modes == ("text-to-image", "image-to-image") and defaults.max_reference_images == 6
    # The sampler menu: FLUX.2's flow-match Euler, as klein's, with its sigma options.
    assert defaults.schedulers == ("FlowMatchEulerDiscreteScheduler",) and "Euler flow" in defaults.samplers


def test_its_defaults_are_diffusers_and_bfls_and_the_tokenizer_loads_without_torchvision(tiny_flux2_dev_dir):
    real = FAMILY.defaults(SimpleNamespace(vae_scale_factor=8))
    assert (real.steps, real.guidance, real.guidance_kind, real.side_multiple) == (50, 4.0, "distilled", 16)
    assert FAMILY.size_presets(1024, 1344)[:3] == ((1024, 1024), (1152, 896), (896, 1152))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        (tokenizer,) = tokenizer_without_torchvision(str(tiny_flux2_dev_dir), None).values()
        assert tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "a fox"}]}])
    else:
        assert tokenizer_without_torchvision(str(tiny_flux2_dev_dir), None) == {}


# -- [dev] and klein told apart ------------------------------------------------------------------------------


def _shapes(folder: Path, name: str) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_file(folder / name).items()}


def test_dev_and_klein_loras_are_told_apart_by_their_hidden_width(dev_loras):
    for case in CASES:
        origin = judge_origin([], lambda c=case: ({}, _shapes(dev_loras, c.file_name)))
        assert origin.families == (Family.FLUX2_DEV,) and origin.denoiser_dims == {88}, case.name
    klein = judge_origin([], lambda: ({}, _shapes(dev_loras, KLEIN_LORA)))
    assert klein.families == (Family.FLUX2,) and klein.denoiser_dims == {56}
    # The real widths: [dev] 6144; klein 3072 (4B) and 4096 (9B); FLUX.2's MLP ratios either way.
    for width, family in ((6144, Family.FLUX2_DEV), (3072, Family.FLUX2), (4096, Family.FLUX2)):
        assert judge_origin([], lambda w=width: ({}, kohya_mlp_shapes(w, 6 * w, 9 * w))).families == (family,)


def test_dev_is_known_by_its_card_metadata_checkpoint_name_and_civitai_label():
    origin = judge_origin([MODEL_ID], lambda: pytest.fail("the card decides"))
    assert (origin.families, origin.how) == ((Family.FLUX2_DEV,), "card")
    found = civitai_base("Flux.2 D")
    assert found is not None and (found.family, found.base_model_id) == (Family.FLUX2_DEV, MODEL_ID)
    for metadata in (
        {"ss_base_model_version": "flux_2_dev"},
        {"modelspec.architecture": "flux-2-dev/lora"},
        {"ss_sd_model_name": "flux2-dev.safetensors"},
    ):
        assert family_from_metadata(metadata) is Family.FLUX2_DEV, metadata
    # klein's spellings stay klein's.
    assert family_from_metadata({"ss_base_model_version": "flux2"}) is Family.FLUX2
    assert family_from_metadata({"ss_sd_model_name": "flux-2-klein-4b.safetensors"}) is Family.FLUX2
    # A klein LoRA by its card (its names and shapes never read) is refused on a [dev] pool, naming both.
    klein = judge_origin([KLEIN], lambda: pytest.fail("the card decides"))
    with pytest.raises(
        IncompatibleLoraError, match=r"made for black-forest-labs/FLUX.2-klein-4B \(flux2\).*FLUX.2-dev"
    ):
        check_origin("LoRA 'x'", klein, MODEL_ID)


def test_a_klein_lora_on_a_dev_pool_is_a_400_naming_the_family(dev_engine):
    with pytest.raises(IncompatibleLoraError, match=r"trained for the flux2 family.*flux2_dev") as caught:
        generate(dev_engine, request(LoraSpec(f"local:{KLEIN_LORA}")))
    assert caught.value.status == 400


def test_a_dev_lora_on_a_klein_pool_is_a_400_naming_the_family(loaded_flux2, base_settings, dev_loras):
    settings = base_settings.replace(local_lora_dir=dev_loras, base_model_id=KLEIN)
    with local_engine(loaded_flux2, settings, dev_loras) as engine:
        with pytest.raises(IncompatibleLoraError, match=r"trained for the flux2_dev family") as caught:
            engine.check_lora(LoraSpec(f"local:{CASES[0].file_name}"))
        assert caught.value.status == 400


# -- previews, fp8 -------------------------------------------------------------------------------------------


def test_previews_project_the_packed_latents(loaded_flux2_dev, base_settings):
    settings = base_settings.replace(base_model_id=MODEL_ID, preview_vae="auto", preview_every=1)
    frames = preview_frames(loaded_flux2_dev, settings, request())
    assert [step for step, _ in frames] == [1, 2] and all(image.size == (32, 32) for _, image in frames)


def test_a_flux2_pool_in_fp8_runs_in_its_compute_dtype(tiny_flux2_dev_dir, base_settings, loaded_flux2_dev):
    """diffusers' FLUX.2 pipelines cast the latents to `transformer.dtype` (the first floating parameter's): fp8
    storage keeps it the pool's compute dtype (its e4m3 weights are buffers); it was e4m3 and the first step
    failed ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn), klein's too. The plan fits [dev] on 48 GB
    this way only."""
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    settings = base_settings.replace(model_id=str(tiny_flux2_dev_dir), base_model_id=MODEL_ID, lora_max_rank=8)
    fp8 = load_pipeline(settings, warm=False, storage="fp8")
    assert fp8.storage == "fp8" and fp8.pipe.transformer.dtype == loaded_flux2_dev.pipe.transformer.dtype
    # The reference: diffusers' pipeline from the same folder, its transformer quantized by torchao (the same bytes).
    reference = Flux2Pipeline.from_pretrained(tiny_flux2_dev_dir)
    quantize_(reference.transformer, Float8WeightOnlyConfig())
    assert_images_close(pipeline_image(fp8), pipeline_image(SimpleNamespace(pipe=reference)))


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
