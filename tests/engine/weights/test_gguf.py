"""A pool whose denoiser is a GGUF file (`MODELS` item `MODEL@GGUF`): tiny FLUX.1 in Q8_0 (32-value blocks) and
Q4_K (256-value K-quant blocks, on a transformer 256 wide so that most of its linears take them), a LoRA on every
linear as a branch, against diffusers' own pipeline on the same file (`from_single_file` with
`GGUFQuantizationConfig`) with the LoRA loaded unfused (`load_lora_weights`): within 2 levels. The stored blocks
hashed identical after 20 mixed swaps with refusals; a file that is not the base's, of an unread quant type,
truncated, or outside GGUF_DIR refused at load."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig
from torch import nn

from engine.errors import LimitExceededError, SettingsError, UnsupportedLoraVariantError
from engine.families.registry import family_spec
from engine.families.spec import FamilySpec
from engine.families.tiny import ensure_tiny_pipeline
from engine.pipeline.compiled import dynamo_compiles
from engine.pipeline.loading import load_pipeline, warm_up
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import Settings
from engine.weights.gguf import GGUFBranchedLinear
from engine.weights.quantized import BranchedLinear, held_branches, stored_bytes
from families import IDENTITIES, Family
from serving.demo.synthetic import find_targets, make_lora, save_lora
from serving.demo.synthetic_lycoris import make_loha
from tests.support import krea2
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.gguf import Q, write_gguf
from tests.support.images import assert_images_close, level_difference

pytest.importorskip("gguf")

BASE = IDENTITIES[Family.FLUX].model_id
LORA = "every_linear.safetensors"
# Kept unquantized, as the published files keep small layers: norms' linears, and Z-Image's timestep linear, whose
# weight dtype diffusers casts the timestep to (`keep_dtype_linears`: quantized, diffusers' own run would fail).
PLAIN = ("norm.", "t_embedder.mlp.0.")


def _flux_256() -> nn.Module:
    """FLUX.1's transformer 256 wide (2 heads of 128, MLP 1024), so that Q4_K's 256-value blocks fit most of its
    linears (those 32 or 64 wide in: Q8_0)."""
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=128,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(16, 56, 56),
    )


def _qwen_64() -> nn.Module:
    """Qwen-Image's transformer 64 wide (the tiny one is 72: no 32-value block fits)."""
    from engine.families.tiny_qwen_image import tiny_qwen_transformer

    return tiny_qwen_transformer(64, (8, 12, 12))


def _zimage_96() -> nn.Module:
    """Z-Image's transformer 96 wide (FFN 256; the tiny one is 24)."""
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=96,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,
        axes_dims=[16, 16, 16],
        axes_lens=[256, 64, 64],
    )


# (family, quant type, the transformer replacing the tiny one's: None keeps it)
CASES = {
    "flux-Q8_0": (Family.FLUX, Q.Q8_0, None),
    "flux-Q4_K": (Family.FLUX, Q.Q4_K, _flux_256),
    "qwen_image-Q8_0": (Family.QWEN_IMAGE, Q.Q8_0, _qwen_64),
    "zimage-Q8_0": (Family.ZIMAGE, Q.Q8_0, _zimage_96),
    "chroma-Q8_0": (Family.CHROMA, Q.Q8_0, None),
    "krea2-Q8_0": (Family.KREA2, Q.Q8_0, krea2.transformer_128_wide),
}


def spec_of(family: Family) -> FamilySpec:
    return family_spec(IDENTITIES[family].model_id)


def model_class(spec: FamilySpec) -> Any:
    return spec.pipeline_class._get_signature_types()[spec.denoiser][0]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case's pipeline folder: the family's tiny one, its transformer replaced where the case says."""
    made = {}
    for case, (family, _, transformer) in CASES.items():
        tiny = IDENTITIES[family].tiny_id
        assert tiny is not None
        folder = ensure_tiny_pipeline(tmp_path_factory.mktemp(f"gguf-{case}") / "pipeline", model_id=tiny)
        if transformer is not None:
            torch.manual_seed(5)
            denoiser = spec_of(family).denoiser
            shutil.rmtree(folder / denoiser)
            transformer().save_pretrained(folder / denoiser)
        made[case] = folder
    return made


def unquantized(folder: Path, spec: FamilySpec) -> Any:
    return model_class(spec).from_pretrained(str(folder), subfolder=spec.denoiser)


def gguf_of(folder: Path, quant: Q, path: Path, spec: FamilySpec | None = None) -> Path:
    """The folder's denoiser written as a GGUF file in diffusers' key names."""
    denoiser = unquantized(folder, spec or spec_of(Family.FLUX))
    return write_gguf(path, denoiser.state_dict(), quant, plain=PLAIN)


def settings_for(base_settings: Any, folder: Path, gguf: Path, base: str = BASE, **changes: Any) -> Any:
    given = {"model_id": str(folder), "base_model_id": base, "gguf": str(gguf), "gguf_dir": gguf.parent}
    return base_settings.replace(**{**given, "lora_max_rank": 8, **changes})


def request(spec: FamilySpec, *loras: LoraSpec) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", loras=loras, steps=2, width=64, height=64, seed=7)


def reference_image(spec: FamilySpec, folder: Path, gguf: Path, loras: Path, checked: Any) -> Any:
    """diffusers' pipeline with its denoiser from the same GGUF file (float32 compute, as the test settings'
    DTYPE) and the LoRA loaded unfused, called as the engine calls it."""
    quantization = GGUFQuantizationConfig(compute_dtype=torch.float32)
    denoiser = model_class(spec).from_single_file(
        str(gguf), config=str(folder), subfolder=spec.denoiser, quantization_config=quantization
    )
    pipe: Any = spec.pipeline_class.from_pretrained(str(folder), **{spec.denoiser: denoiser})
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name="a0")
    arguments = spec.call_arguments(checked)
    image = pipe(**arguments, generator=torch.Generator("cpu").manual_seed(7), output_type="pil").images[0]
    return pixels(image)


def linear_targets(folder: Path, spec: FamilySpec | None = None) -> list[Any]:
    """Every linear of the folder's denoiser as a LoRA target (its shapes as read unquantized: a GGUF linear's
    weight is its blocks, rows x bytes)."""
    spec = spec or spec_of(Family.FLUX)
    found = find_targets({spec.denoiser: unquantized(folder, spec)}, {spec.denoiser: (".",)})
    return [t for t in found if not t.is_conv]


def blocks_hash(denoiser: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, data in sorted(stored_bytes(denoiser).items()):
        digest.update(name.encode())
        digest.update(data)
    return digest.hexdigest()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_each_gguf_pool_with_a_lora_is_diffusers_unfused_on_the_same_file(case, folders, base_settings, tmp_path):
    family, quant, _ = CASES[case]
    spec, folder = spec_of(family), folders[case]
    gguf = gguf_of(folder, quant, tmp_path / f"{case}.gguf", spec)
    settings = settings_for(base_settings, folder, gguf, spec.identity.model_id)
    loaded = load_pipeline(settings, warm=False)
    assert loaded.storage == "gguf" and loaded.branch_rank == 8
    denoiser = loaded.denoiser
    linears = {n: m for n, m in denoiser.named_modules() if isinstance(m, nn.Linear)}
    assert linears and all(isinstance(m, BranchedLinear) for m in linears.values())
    quantized = [m for m in linears.values() if isinstance(m, GGUFBranchedLinear)]
    assert sum(m.quant_type == quant for m in quantized) > len(linears) // 2, "most linears in the case's type"
    loras = tmp_path / "loras"
    # Its metadata names the family (ModelSpec's architecture), as editing families' LoRAs must.
    metadata = {"modelspec.architecture": f"{spec.identity.spellings.architectures[0]}/lora"}
    lora = make_lora(linear_targets(folder, spec), rank=4, seed=3, strength=0.3, dtype=torch.float32)
    save_lora(loras / LORA, lora, metadata)
    before = blocks_hash(denoiser)
    with local_engine(loaded, settings.replace(local_lora_dir=loras), loras) as engine:
        base = generate(engine, request(spec)).image
        ours = generate(engine, request(spec, LoraSpec(f"local:{LORA}")))
        status = engine.status()
    # The pool names its quant types, most linears first.
    assert status.storage == "gguf" and status.gguf_types.startswith(quant.name), status.gguf_types
    theirs = reference_image(spec, folder, gguf, loras, ours.request)
    assert pixels(ours.image).std() > 1, "a blank image (NaN latents decode to black)"
    assert level_difference(ours.image, base) > 2, "the LoRA must visibly change the image"
    assert_images_close(pixels(ours.image), theirs, case)
    assert blocks_hash(denoiser) == before
    assert held_branches(denoiser) == []


def test_gguf_blocks_untouched_by_20_mixed_swaps_with_refusals(folders, base_settings, tmp_path):
    folder = folders["flux-Q8_0"]
    gguf = gguf_of(folder, Q.Q8_0, tmp_path / "flux.gguf")
    settings = settings_for(base_settings, folder, gguf, lora_max_rank=4)
    loaded = load_pipeline(settings, warm=False)
    denoiser = loaded.denoiser
    before = blocks_hash(denoiser)
    targets = linear_targets(folder)
    loras = tmp_path / "loras"
    save_lora(loras / "a.safetensors", make_lora(targets, rank=2, seed=1, strength=0.3, dtype=torch.float32))
    save_lora(loras / "b.safetensors", make_lora(targets[:6], rank=2, seed=2, strength=0.3, dtype=torch.float32))
    save_lora(loras / "big.safetensors", make_lora(targets, rank=8, seed=3, strength=0.3, dtype=torch.float32))
    save_lora(loras / "loha.safetensors", make_loha(targets[:4], rank=2, seed=4, fmt="peft", dtype=torch.float32))
    # Over the rank limit, or a LoHa on the denoiser: refused with a 400, between swaps that succeed.
    cases = ([("a",), ("loha",), ("a", "b"), ("big",), ("b", "loha"), ("a", "big"), ()] * 3)[:20]
    refused = []
    with local_engine(loaded, settings.replace(local_lora_dir=loras), loras) as engine:
        for names in cases:
            specs = [LoraSpec(f"local:{name}.safetensors") for name in names]
            try:
                generate(engine, GenerateRequest(prompt="a fox", loras=specs, steps=1, width=64, height=64, seed=1))
            except (LimitExceededError, UnsupportedLoraVariantError) as e:
                assert e.status == 400, e
                refused.append(names)
            assert blocks_hash(denoiser) == before
    assert refused == [names for names in cases if {"big", "loha"} & set(names)]
    assert held_branches(denoiser) == []
    assert blocks_hash(denoiser) == before


# -- refusals at load ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def q8_file(folders, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_of(folders["flux-Q8_0"], Q.Q8_0, tmp_path_factory.mktemp("gguf-files") / "flux-Q8_0.gguf")


def test_a_gguf_of_another_denoiser_is_refused_naming_the_form(folders, q8_file, base_settings):
    # The wide transformer's file on the narrow base: the same names, other shapes.
    wide = gguf_of(folders["flux-Q4_K"], Q.Q8_0, q8_file.parent / "wide-Q8_0.gguf")
    with pytest.raises(SettingsError, match=r"does not fit this base's denoiser.*accepted: a GGUF of the base's own"):
        load_pipeline(settings_for(base_settings, folders["flux-Q8_0"], wide), warm=False)


def test_a_flux_gguf_on_a_qwen_image_base_is_refused(folders, q8_file, base_settings):
    qwen = spec_of(Family.QWEN_IMAGE).identity.model_id
    settings = settings_for(base_settings, folders["qwen_image-Q8_0"], q8_file, qwen)
    with pytest.raises(SettingsError, match=r"does not fit this base's denoiser \(QwenImageTransformer2DModel\)"):
        load_pipeline(settings, warm=False)


def test_a_gguf_missing_tensors_is_refused(folders, base_settings, tmp_path):
    transformer = unquantized(folders["flux-Q8_0"], spec_of(Family.FLUX))
    tensors = {k: v for k, v in transformer.state_dict().items() if "single_transformer_blocks.1." not in k}
    partial = write_gguf(tmp_path / "partial.gguf", tensors, Q.Q8_0)
    with pytest.raises(SettingsError, match=r"does not fit .* it lacks single_transformer_blocks\.1\.attn\.norm_k"):
        load_pipeline(settings_for(base_settings, folders["flux-Q8_0"], partial), warm=False)


def test_a_truncated_gguf_is_refused(folders, q8_file, base_settings, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = q8_file.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(SettingsError, match=r"cannot be read.*accepted: a complete GGUF file"):
        load_pipeline(settings_for(base_settings, folders["flux-Q8_0"], cut), warm=False)


def test_a_quant_type_no_dequantizer_reads_is_refused(folders, base_settings, tmp_path):
    # TQ1_0 (ternary, 256-value blocks): gguf writes it, diffusers reads no such block.
    odd = write_gguf(tmp_path / "odd.gguf", {"proj_out.weight": torch.randn(64, 256)}, Q.TQ1_0)
    with pytest.raises(SettingsError, match=r"type TQ1_0, which no diffusers dequantizer reads; accepted: .*Q4_K"):
        load_pipeline(settings_for(base_settings, folders["flux-Q8_0"], odd), warm=False)


def test_a_local_gguf_outside_gguf_dir_is_refused(folders, q8_file, base_settings, tmp_path):
    elsewhere = tmp_path / "allowed"
    elsewhere.mkdir()
    settings = settings_for(base_settings, folders["flux-Q8_0"], q8_file).replace(gguf_dir=elsewhere)
    with pytest.raises(SettingsError, match="outside the allowed places; accepted: an absolute path under GGUF_DIR"):
        load_pipeline(settings, warm=False)
    # A link inside GGUF_DIR to a file outside it, and a path climbing out of it.
    link = elsewhere / "link.gguf"
    link.symlink_to(q8_file)
    for escape in (link, elsewhere / ".." / ".." / q8_file.parent.name / q8_file.name):
        with pytest.raises(SettingsError, match="outside the allowed places"):
            load_pipeline(settings.replace(gguf=str(escape)), warm=False)
    with pytest.raises(SettingsError, match=r"GGUF_DIR \(unset\)"):
        load_pipeline(settings.replace(gguf_dir=None), warm=False)


def test_a_tiny_model_takes_its_gguf_denoiser_as_a_folder_does(folders, q8_file, base_settings):
    """`MODELS=tiny-flux@/…/flux-Q8_0.gguf` (the tiny pipeline built in memory, its transformer's config written
    for diffusers) serves the image the saved folder with the same file serves."""
    models = Settings.from_env({"MODELS": f"tiny-flux@{q8_file}", "GGUF_DIR": str(q8_file.parent)})
    (pool,) = models.pool_settings
    tiny = base_settings.replace(gguf_dir=q8_file.parent).for_pool(pool)
    images = []
    for settings in (tiny, settings_for(base_settings, folders["flux-Q8_0"], q8_file)):
        loaded = load_pipeline(settings, warm=False)
        assert loaded.storage == "gguf" and loaded.gguf_types.startswith("Q8_0")
        with local_engine(loaded, settings) as engine:
            images.append(pixels(generate(engine, request(spec_of(Family.FLUX))).image))
    assert images[0].std() > 1
    assert_images_close(images[0], images[1], "tiny-flux@file against its folder@file")


@pytest.mark.timeout(900)
def test_nine_branch_swaps_on_a_compiled_gguf_pool_recompile_nothing_and_equal_eager(folders, q8_file, base_settings):
    """Compiled with dynamo's `aot_eager` for one size (as the fp8 pool's test): the widening of the blocks and the
    padded branch trace once; swaps only copy into the buffers."""
    folder = folders["flux-Q8_0"]
    loras = q8_file.parent / "compile-loras"
    targets = linear_targets(folder)
    for index in range(3):
        lora = make_lora(targets[index::2], rank=2 + index, seed=index, strength=0.3, dtype=torch.float32)
        save_lora(loras / f"l{index}.safetensors", lora)
    eager_settings = settings_for(base_settings, folder, q8_file, local_lora_dir=loras)
    compiled_settings = eager_settings.replace(compile="default")
    compiled = warm_up(
        load_pipeline(compiled_settings, warm=False), compiled_settings, backend="aot_eager", sizes=[(64, 64)]
    )
    forward = compiled.compiled
    assert forward is not None and forward.shapes == 1
    sets = [(f"l{i % 3}",) if i % 3 else (f"l{i % 3}", f"l{(i + 1) % 3}") for i in range(9)]
    requests = [request(spec_of(Family.FLUX), *(LoraSpec(f"local:{n}.safetensors") for n in names)) for names in sets]
    try:
        with local_engine(compiled, compiled_settings, loras) as engine:
            before = dynamo_compiles()
            with torch._dynamo.config.patch(error_on_recompile=True):
                results = [generate(engine, r) for r in requests]
        assert dynamo_compiles() == before and forward.recompiles == 0 and forward.eager_calls == 0
    finally:
        forward.remove()
    eager = load_pipeline(eager_settings, warm=False)
    with local_engine(eager, eager_settings, loras) as engine:
        for one, result in zip(requests, results, strict=True):
            assert_images_close(result.image, generate(engine, one).image, one.loras)
