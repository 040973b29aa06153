"""LTX-2.5 as a checkpoint of LTX-2 (`families/ltx2.py`'s `LTX2_5`): a tiny LTX-2.5 (diffusers 0.42.1's 2.5 switches
on the tiny transformer and connectors: no prompt modulation MLP, no feed-forward biases, per-modality connector
projections, the keyframe position embedding) saved as an ordinary diffusers folder and loaded as a pool by
`LTX2Pipeline`, the standard class. A LoRA over its layers gives diffusers' own video and sound
(load_lora_weights + fuse_lora); a LoRA of LTX-2.3's prompt modulation, which 2.5 lacks, is refused naming the layer,
and the base is bit-exact after; one whose metadata names LTX-2.3 runs with a warning naming that version."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.errors import IncompatibleLoraError
from engine.families.ltx2 import FAMILY
from engine.families.registry import family_spec
from engine.families.tiny_ltx2 import TINY_WIDTH, build_tiny_pipeline
from engine.requests import GenerateRequest, LoraSpec
from families.ltx2 import MODEL_ID_2_3, MODEL_ID_2_5
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine
from tests.support.ltx2 import (
    FRAMES,
    PROMPT,
    STEPS,
    TRANSFORMER,
    assert_same_video,
    diffusers_video,
    factors,
    lora_file,
)

# LTX-2.5's connectors: the per-modality projections and a block of each stream's connector.
CONNECTORS = (
    "connectors.video_text_proj_in",
    "connectors.audio_text_proj_in",
    "connectors.video_connector.transformer_blocks.0.attn1.to_q",
)
_COMPONENTS = ("transformer", "connectors", "text_encoder", "vae", "audio_vae", "vocoder")


@pytest.fixture(scope="module")
def tiny_2_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-ltx2-5") / "pipeline"
    build_tiny_pipeline(0, ltx2_5=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loras_2_5(tiny_2_5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers import LTX2Pipeline

    folder = tmp_path_factory.mktemp("ltx2-5-loras")
    pipe = LTX2Pipeline.from_pretrained(tiny_2_5)
    save_lora(folder / "ltx25.safetensors", lora_file(factors(pipe, (*TRANSFORMER, *CONNECTORS), seed=81), "peft"))
    # LTX-2.3's prompt modulation (`prompt_adaln`), which LTX-2.5 drops, beside layers both have.
    generator = torch.Generator().manual_seed(82)
    made = factors(pipe, TRANSFORMER[:2], seed=83)
    made["transformer.prompt_adaln.linear"] = (
        torch.randn(4, TINY_WIDTH, generator=generator),
        torch.randn(2 * TINY_WIDTH, 4, generator=generator),
    )
    save_lora(folder / "ltx23_prompt_adaln.safetensors", lora_file(made, "peft"))
    return folder


@pytest.fixture(scope="module")
def loaded_2_5(tiny_2_5: Path, base_settings):
    from engine.pipeline.loading import load_pipeline

    return load_pipeline(base_settings.replace(model_id=str(tiny_2_5), base_model_id=MODEL_ID_2_5))


@pytest.fixture
def engine_2_5(loaded_2_5, loras_2_5: Path, base_settings):
    settings = base_settings.replace(local_lora_dir=loras_2_5, base_model_id=MODEL_ID_2_5)
    with local_engine(loaded_2_5, settings, loras_2_5) as engine:
        yield engine


def _request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": STEPS, "width": 64, "height": 64, "seed": 7, "num_frames": FRAMES} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


def test_an_ltx2_5_pool_is_ltx2s_family_through_the_standard_pipeline(loaded_2_5):
    assert family_spec(MODEL_ID_2_5) is FAMILY and loaded_2_5.family is FAMILY
    transformer = loaded_2_5.pipe.transformer
    assert type(loaded_2_5.pipe).__name__ == "LTX2Pipeline"
    assert not transformer.config.use_prompt_adaln_single and not hasattr(transformer, "prompt_adaln")


def test_an_ltx2_5_lora_equals_diffusers_fused_on_every_frame_and_the_sound(engine_2_5, tiny_2_5, loras_2_5):
    result = generate(engine_2_5, _request(LoraSpec("local:ltx25.safetensors", scale=0.8)))
    assert_same_video(result, diffusers_video(tiny_2_5, loras_2_5, "ltx25.safetensors", 0.8), "LTX-2.5 LoRA")


def test_an_ltx2_3_prompt_modulation_lora_is_refused_on_ltx2_5_naming_the_layer_and_the_base_is_kept(
    engine_2_5, loaded_2_5
):
    pristine = {
        f"{name}.{key}": value.detach().clone()
        for name in _COMPONENTS
        for key, value in getattr(loaded_2_5.pipe, name).state_dict().items()
    }
    with pytest.raises(IncompatibleLoraError, match="prompt_adaln"):
        generate(engine_2_5, _request(LoraSpec("local:ltx23_prompt_adaln.safetensors"), steps=1))
    assert_components_pristine(loaded_2_5.pipe, pristine, _COMPONENTS)


def test_a_lora_whose_metadata_names_ltx2_3_runs_on_ltx2_5_with_a_warning_naming_it(engine_2_5, loras_2_5):
    from safetensors.torch import load_file

    tensors = load_file(str(loras_2_5 / "ltx25.safetensors"))
    save_lora(loras_2_5 / "named_2_3.safetensors", tensors, {"modelspec.architecture": "ltx-2.3"})
    result = generate(engine_2_5, _request(LoraSpec("local:named_2_3.safetensors"), steps=1))
    assert any(f"made for LTX-2.3 22B ({MODEL_ID_2_3})" in w and MODEL_ID_2_5 in w for w in result.warnings), (
        result.warnings
    )
