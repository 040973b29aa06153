"""Full differences on a quantized Wan pool (`QUANTIZE=fp8`, `QUANTIZE=int4`, a GGUF file): a difference of a
tensor the pool keeps in its compute dtype (a norm's weight or bias, a block's or the head's modulation table, a
Linear's bias) is fused exactly in place as on any pool, beside the LoRA's factors as branches; the video equals, on
every frame within 2 levels, diffusers' own pipeline on the same stored weights (torchao's `Float8WeightOnlyConfig`
or `PrototypeInt4WeightOnlyConfig`, or `from_single_file` with `GGUFQuantizationConfig`) with the factors loaded
unfused through PEFT and the differences added to its weights by hand at the LoRA's scale (ComfyUI's math). A full
difference of a quantized linear's weight is refused by name with what is accepted, changing nothing. After, every
tensor is bit-exact and the stored bytes hash identical."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import GGUFQuantizationConfig, WanTransformer3DModel
from torch import nn

from engine.errors import UnsupportedLoraVariantError
from engine.families.registry import family_spec
from engine.families.spec import FamilySpec
from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, LoraSpec
from families.wan import MODEL_ID as WAN
from serving.demo.synthetic import save_lora
from tests.engine.weights.test_quantized_wan import GROUP, digest, gguf_files, settings_for, wide_folder
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.images import assert_images_close, level_difference
from tests.support.wan import FRAMES, MODULES, PROMPT, factors, lora_file

pytest.importorskip("torchao")
pytest.importorskip("gguf")

FILE, PLAIN, LINEAR = "differences.safetensors", "plain.safetensors", "linear_difference.safetensors"
SCALE = 0.9
# The transformer's parameter (diffusers' names) -> its full difference's name in the file (Wan's original names).
DIFFERENCES = {
    "blocks.0.norm2.weight": "blocks.0.norm3.diff",
    "blocks.0.norm2.bias": "blocks.0.norm3.diff_b",
    "blocks.1.attn1.norm_k.weight": "blocks.1.self_attn.norm_k.diff",
    "blocks.0.scale_shift_table": "blocks.0.diff_m",
    "scale_shift_table": "head.diff_m",
    "blocks.0.attn1.to_q.bias": "blocks.0.self_attn.q.diff_b",
    "blocks.1.ffn.net.2.bias": "blocks.1.ffn.2.diff_b",
}


def write_files(transformer: nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """The factors alone, with the differences, and with a quantized linear's full difference too; the differences
    by the transformer's parameter names."""
    generator = torch.Generator().manual_seed(11)
    differences = {
        name: torch.randn(transformer.get_parameter(name).shape, generator=generator) * 0.3 for name in DIFFERENCES
    }
    plain = lora_file(factors(transformer, MODULES[:6], seed=81), "comfy", 2.0)
    save_lora(folder / PLAIN, plain)
    full = plain | {f"diffusion_model.{DIFFERENCES[name]}": d for name, d in differences.items()}
    save_lora(folder / FILE, full)
    save_lora(folder / LINEAR, full | {"diffusion_model.blocks.1.self_attn.q.diff": torch.randn(64, 64) * 0.05})
    return differences


def request(name: str) -> GenerateRequest:
    lora = LoraSpec(f"local:{name}", scale=SCALE)
    return GenerateRequest(prompt=PROMPT, loras=(lora,), steps=3, width=64, height=64, seed=7, num_frames=FRAMES)


def reference_frames(
    spec: FamilySpec, folder: Path, loras: Path, storage: str, files: list[Path], differences: dict, checked
) -> list:
    """diffusers' own pipeline on the same stored weights, each difference added to its parameter by hand at the
    LoRA's scale, then the factors loaded unfused through PEFT at that scale."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    if storage == "gguf":
        quantization = GGUFQuantizationConfig(compute_dtype=torch.float32)
        transformer = WanTransformer3DModel.from_single_file(
            str(files[0]), config=str(folder), subfolder="transformer", quantization_config=quantization
        )
    else:
        transformer = WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer")
    with torch.no_grad():
        for name, difference in differences.items():
            transformer.get_parameter(name).add_(difference, alpha=SCALE)
    pipe: Any = spec.pipeline_class.from_pretrained(str(folder), transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    with warnings.catch_warnings():
        # PEFT warns that such a layer cannot merge: the reference never merges (it is the unfused one).
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        if storage != "gguf":
            config = Float8WeightOnlyConfig() if storage == "fp8" else PrototypeInt4WeightOnlyConfig(group_size=GROUP)
            quantize_(pipe.transformer, config, filter_fn=lambda m, _: isinstance(m, nn.Linear))
        pipe.load_lora_weights(str(loras), weight_name=PLAIN, adapter_name="a")
        pipe.transformer.set_adapters(["a"], weights=[SCALE])
    output = pipe(**spec.call_arguments(checked), generator=torch.Generator("cpu").manual_seed(7), output_type="pil")
    return list(output.frames[0])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("storage", ("fp8", "int4", "gguf"))
def test_a_quantized_pool_fuses_norm_bias_and_modulation_differences_and_refuses_a_quantized_linears(
    storage, base_settings, tmp_path
):
    spec = family_spec(WAN)
    folder = wide_folder(spec, tmp_path)
    files = gguf_files(folder, spec, tmp_path / "gguf") if storage == "gguf" else []
    loras = tmp_path / "loras"
    differences = write_files(WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer"), loras)
    settings = settings_for(base_settings, spec, folder, storage, files, local_lora_dir=loras)
    loaded = load_pipeline(settings, warm=False)
    stored, before = digest(loaded), {k: v.clone() for k, v in loaded.pipe.transformer.state_dict().items()}
    with local_engine(loaded, settings, loras) as engine:
        plain = generate(engine, request(PLAIN))
        ours = generate(engine, request(FILE))
        with pytest.raises(UnsupportedLoraVariantError, match=r"full differences of linear weights") as caught:
            generate(engine, request(LINEAR))
        message = str(caught.value)
        assert caught.value.status == 400 and "transformer.blocks.1.attn1.to_q" in message, message
        assert "accepted there: plain LoRA and LoCon factors, and full differences of biases, norms" in message
        engine.restore_base_weights()
    assert digest(loaded) == stored
    for key, value in loaded.pipe.transformer.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} drifted"
    theirs = reference_frames(spec, folder, loras, storage, files, differences, ours.request)
    assert level_difference(ours.frames[-1], plain.frames[-1]) > 2, "the differences must visibly change the video"
    assert len(ours.frames) == len(theirs) == FRAMES
    for index, (frame, expected) in enumerate(zip(ours.frames, theirs, strict=True)):
        assert pixels(frame).std() > 1, "a blank frame (NaN latents decode to black)"
        assert_images_close(pixels(frame), pixels(expected), f"{storage}: frame {index}")
