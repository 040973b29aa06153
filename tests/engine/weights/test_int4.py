"""int4 pools (QUANTIZE=int4): the denoiser's linears as torchao's int4 codes with group scales and zeros, LoRAs as
low-rank branches beside them.

References are torchao's and diffusers' own: each linear's scales and zeros are those of torchao's CPU int4 tensor
(`PrototypeInt4WeightOnlyConfig`, `Int4OpaqueTensor`), its widened weight torchao's `_dequantize_affine_tinygemm`
bit for bit, and tiny FLUX.1 and Qwen-Image with a LoRA equal diffusers' own pipeline on torchao's int4 module
with the LoRA loaded unfused through PEFT, within 2 levels. Groups of 32 (`INT4_GROUP_SIZE`): the tiny widths
(32 to 288) divide by it but the tiny Qwen-Image's 72, so its transformer is rebuilt 64 wide here; a linear no
group divides stays in the compute dtype in both (torchao's `quantize_` skips it; its CPU pack also takes
outputs in multiples of 16 only). The stored packs, scales and zeros are byte-identical after 20 mixed
swaps with refusals.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import Krea2Pipeline, QwenImagePipeline
from safetensors.torch import save_file
from torch import nn

from engine.errors import LimitExceededError, UnsupportedLoraVariantError
from engine.families.registry import family_spec
from engine.families.spec import FamilySpec
from engine.families.tiny import ensure_tiny_pipeline
from engine.families.tiny_qwen_image import tiny_qwen_transformer
from engine.pipeline.loading import load_pipeline
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from engine.weights.int4 import Int4Linear
from engine.weights.quantized import BranchedLinear, held_branches, stored_bytes
from families.chroma import MODEL_ID as CHROMA_MODEL_ID
from families.flux import MODEL_ID as FLUX_MODEL_ID
from families.krea2 import MODEL_ID as KREA2_MODEL_ID
from families.qwen_image import MODEL_ID as QWEN_IMAGE_MODEL_ID
from serving.demo.synthetic import find_targets, make_lora, save_lora
from tests.support import krea2
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.images import assert_images_close, level_difference

pytest.importorskip("torchao")

GROUP = 32
LORA = "every_linear.safetensors"


def torchao_int4(linear: nn.Linear) -> nn.Linear:
    """A copy of `linear` quantized by torchao's int4 weight-only config for the CPU."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    copy = nn.Linear(linear.in_features, linear.out_features, dtype=linear.weight.dtype)
    copy.load_state_dict(linear.state_dict())
    quantize_(copy, PrototypeInt4WeightOnlyConfig(group_size=GROUP))
    return copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int4_linear_holds_torchaos_scales_and_zeros_and_widens_as_torchao_does(dtype):
    from torchao.quantization.quant_primitives import _dequantize_affine_tinygemm
    from torchao.quantization.utils import unpack_tinygemm_scales_and_zeros

    linear = nn.Linear(256, 96, dtype=dtype)
    ours, theirs = Int4Linear(linear, 4, dtype, group_size=GROUP), torchao_int4(linear)
    scale, zero = unpack_tinygemm_scales_and_zeros(theirs.weight.scale_and_zero)
    assert torch.equal(ours.weight_scale, scale.squeeze(-1)) and torch.equal(ours.weight_zero, zero.squeeze(-1))
    assert ours.weight_packed.shape == (96, 128) and ours.weight_packed.dtype == torch.uint8
    codes = torch.stack((ours.weight_packed & 15, ours.weight_packed >> 4), dim=-1).view(96, 256).to(torch.int32)
    widened = _dequantize_affine_tinygemm(
        codes, [1, GROUP], ours.weight_scale, ours.weight_zero, torch.int32, 0, 15, output_dtype=dtype
    )
    assert torch.equal(ours.dequantized(dtype), widened)
    x = torch.randn(3, 5, 256, dtype=dtype)
    with torch.no_grad():
        got, expected = ours(x).float(), theirs(x).float()
    # The CPU kernel widens in float32 inside its matmul: in bf16 ours rounds the widened weight to bf16 first.
    error = (got - expected).norm() / expected.norm()
    assert error < (0.01 if dtype == torch.bfloat16 else 1e-6)


def test_an_int4_linear_s_branch_adds_peft_s_unfused_lora():
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    linear = nn.Linear(128, 64)
    ours = Int4Linear(linear, 8, torch.float32, group_size=GROUP)
    model = nn.Sequential(torchao_int4(linear))
    with warnings.catch_warnings():
        # PEFT's torchao LoRA layer cannot merge: the reference is the unfused one.
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2, target_modules=["0"]), model)
    peft_layer: Any = model[0]
    assert type(peft_layer).__name__ == "TorchaoLoraLinear"  # PEFT's own layer for torchao weights
    nn.init.normal_(peft_layer.lora_B["default"].weight)
    down, up = peft_layer.lora_A["default"].weight.detach(), peft_layer.lora_B["default"].weight.detach()
    ours.load_branch([(down, up, 0.5)])
    x = torch.randn(7, 128)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x), rtol=1e-4, atol=1e-4)
    assert ours.branch_rank == 4


def int4_settings(base_settings: Any, folder: Path, model_id: str, **overrides: Any) -> Any:
    return base_settings.replace(
        model_id=str(folder), base_model_id=model_id, quantize="int4", int4_group_size=GROUP, **overrides
    )


def request(spec: FamilySpec, *loras: LoraSpec, steps: int = 2) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=loras, steps=steps, width=64, height=64, seed=7)


def reference_image(spec: FamilySpec, folder: Path, loras: Path, checked: CheckedRequest) -> np.ndarray:
    """diffusers' pipeline from the same folder, its denoiser's linears quantized by torchao's int4 (those no
    group divides skipped, as torchao does), the LoRA loaded unfused through PEFT."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    pipe: Any = spec.pipeline_class.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    quantize_(
        getattr(pipe, spec.denoiser),
        PrototypeInt4WeightOnlyConfig(group_size=GROUP),
        # torchao's CPU pack refuses outputs not a multiple of 16 (Qwen-Image's 72): those stay in both.
        filter_fn=lambda module, name: isinstance(module, nn.Linear) and module.out_features % 16 == 0,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name="a0")
    image = pipe(**spec.call_arguments(checked), generator=torch.Generator("cpu").manual_seed(7)).images[0]
    return pixels(image)


def qwen_image_64_wide(folder: Path, tmp_path: Path) -> Path:
    """The tiny Qwen-Image with its transformer 64 wide (2 heads of 32) instead of 72, which no int4 group divides:
    a folder of its own."""
    pipe: Any = QwenImagePipeline.from_pretrained(str(folder))
    torch.manual_seed(0)
    pipe.transformer = tiny_qwen_transformer(64, axes_dims_rope=(8, 12, 12))
    pipe.save_pretrained(str(tmp_path / "wide"))
    return tmp_path / "wide"


def krea2_128_wide(folder: Path, tmp_path: Path) -> Path:
    """The tiny Krea 2 with its transformer 128 wide instead of 104, which no int4 group divides: a folder of its
    own."""
    pipe: Any = Krea2Pipeline.from_pretrained(str(folder))
    torch.manual_seed(0)
    pipe.transformer = krea2.transformer_128_wide()
    pipe.save_pretrained(str(tmp_path / "wide"))
    return tmp_path / "wide"


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("model_id", "rebuild"),
    [
        (FLUX_MODEL_ID, None),
        (QWEN_IMAGE_MODEL_ID, qwen_image_64_wide),
        (CHROMA_MODEL_ID, None),
        (KREA2_MODEL_ID, krea2_128_wide),
    ],
    ids=["flux", "qwen", "chroma", "krea2"],
)
def test_each_dit_in_int4_with_a_lora_is_diffusers_unfused_on_torchaos_int4_module(
    model_id, rebuild, base_settings, tmp_path
):
    spec = family_spec(model_id)
    folder = ensure_tiny_pipeline(tmp_path / "pipeline", model_id=str(spec.identity.tiny_id))
    folder = folder if rebuild is None else rebuild(folder, tmp_path)
    settings = int4_settings(base_settings, folder, model_id, lora_max_rank=4)
    loaded = load_pipeline(settings, warm=False)
    assert loaded.storage == "int4" and loaded.branch_rank == 4
    denoiser = loaded.denoiser
    linears = {n: m for n, m in denoiser.named_modules() if isinstance(m, nn.Linear)}
    assert linears and all(isinstance(m, BranchedLinear) for m in linears.values())
    quantized = {n for n, m in linears.items() if isinstance(m, Int4Linear)}
    packable = {n for n, m in linears.items() if m.in_features % GROUP == 0 and m.out_features % 16 == 0}
    assert quantized == packable and len(quantized) > 5
    loras = tmp_path / "loras"
    targets = [t for t in find_targets({spec.denoiser: denoiser}, {spec.denoiser: (".",)}) if not t.is_conv]
    # Its metadata names the family (ModelSpec's architecture): Krea 2's attention names alone are FLUX's too.
    metadata = {"modelspec.architecture": f"{spec.identity.spellings.architectures[0]}/lora"}
    save_lora(loras / LORA, make_lora(targets, rank=4, seed=3, strength=0.3, dtype=torch.float32), metadata)
    with local_engine(loaded, settings.replace(local_lora_dir=loras), loras) as engine:
        base = generate(engine, request(spec)).image
        ours = generate(engine, request(spec, LoraSpec(f"local:{LORA}")))
    theirs = reference_image(spec, folder, loras, ours.request)
    assert pixels(ours.image).std() > 1, "a blank image (NaN latents decode to black)"
    assert level_difference(ours.image, base) > 2, "the LoRA must visibly change the image"
    assert_images_close(pixels(ours.image), theirs, spec.family)


@pytest.fixture(scope="module")
def int4_flux(base_settings, tiny_flux_dir, loaded_flux, tmp_path_factory):
    """The tiny FLUX.1 in int4 with branches of rank 8, two rank-4 LoRAs, one of rank 16 and a LoHa."""
    folder = tmp_path_factory.mktemp("int4-loras")
    settings = int4_settings(base_settings, tiny_flux_dir, FLUX_MODEL_ID, lora_max_rank=8, local_lora_dir=folder)
    loaded = load_pipeline(settings)
    targets = [t for t in find_targets({"transformer": loaded.denoiser}, {"transformer": (".",)}) if not t.is_conv]
    for name, rank, seed in (("a", 4, 1), ("b", 4, 2), ("wide", 16, 3)):
        save_lora(folder / f"{name}.safetensors", make_lora(targets, rank=rank, seed=seed, dtype=torch.float32))
    generator = torch.Generator().manual_seed(42)
    out, inp = loaded_flux.pipe.transformer.x_embedder.weight.shape
    loha = {
        f"transformer.x_embedder.{name}": torch.randn(shape, generator=generator) * 0.1
        for name, shape in (("hada_w1_a", (out, 2)), ("hada_w1_b", (2, inp)), ("hada_w2_a", (out, 2)))
    }
    loha["transformer.x_embedder.hada_w2_b"] = torch.randn((2, inp), generator=generator) * 0.1
    save_file(loha, folder / "loha.safetensors")
    with local_engine(loaded, settings, folder) as engine:
        yield loaded, engine


def test_int4_stored_bytes_are_identical_after_20_mixed_swaps_with_refusals(int4_flux):
    loaded, engine = int4_flux
    spec = loaded.family
    transformer = loaded.pipe.transformer
    before = stored_bytes(transformer)
    assert any(key.endswith("weight_packed") for key in before) and any(k.endswith("weight_zero") for k in before)
    base = generate(engine, request(spec, steps=1)).image.tobytes()
    sets = [("a",), ("b",), ("a", "b"), ("wide",), ("loha",)]
    refused = 0
    for index in range(20):
        names = sets[index % len(sets)]
        loras = [LoraSpec(f"local:{n}.safetensors", scale=0.5 + index / 20) for n in names]
        if names[0] in ("wide", "loha"):
            with pytest.raises((LimitExceededError, UnsupportedLoraVariantError)) as caught:
                generate(engine, request(spec, *loras, steps=1))
            assert caught.value.status == 400
            refused += 1
        else:
            assert generate(engine, request(spec, *loras, steps=1)).swapped
    assert refused == 8 and stored_bytes(transformer) == before
    assert generate(engine, request(spec, steps=1)).image.tobytes() == base
    assert held_branches(transformer) == []


def test_a_compiled_int4_linear_widens_as_the_eager_one_and_a_swap_recompiles_nothing():
    """Compiled, the plain formula at the padded rank (as fp8's): equal to eager's chunked widening, and swapping
    branch factors (another LoRA, or none) reuses the graph."""
    torch.manual_seed(0)
    module = Int4Linear(nn.Linear(128, 64), 8, torch.float32, group_size=GROUP)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    x = torch.randn(5, 128)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for rank in (0, 4, 8, 0):
            factors = [(torch.randn(rank, 128), torch.randn(64, rank), 0.5)] if rank else []
            module.load_branch(factors)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
