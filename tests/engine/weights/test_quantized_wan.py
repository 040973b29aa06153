"""Quantized Wan pools: the tiny Wan 2.1 and Wan 2.2 A14B (transformers rebuilt 64 wide, 2 heads of 32 with a
feed-forward 128 wide, so that int4's 32-value groups and GGUF's 32-value Q8_0 blocks fit every block's linears)
with their transformers stored in fp8 (`QUANTIZE=fp8`), int4 (`QUANTIZE=int4`) or read from GGUF files
(`MODEL@GGUF`, A14B `MODEL@GGUF@GGUF_2`; in diffusers' names or in Wan's original ones, as QuantStack's files
name them), on BOTH of A14B's transformers, a LoRA as low-rank branches on each
(A14B: `scale` on the high-noise one, `scale_2` on the low-noise one). Each video equals diffusers' own pipeline on
the same stored weights (torchao's `Float8WeightOnlyConfig` / `PrototypeInt4WeightOnlyConfig` modules, or
`from_single_file` with `GGUFQuantizationConfig`) with the LoRA loaded unfused through PEFT, each side at its own
scale, within 2 levels on every frame. The stored bytes of every stored transformer hash identical after swaps with
refusals; a MODELS item naming another number of GGUF files than the base has transformers is refused at load,
naming the accepted form."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import GGUFQuantizationConfig, WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from torch import nn

from engine.errors import LimitExceededError, SettingsError
from engine.families.registry import family_spec
from engine.families.spec import FamilySpec
from engine.families.tiny import ensure_tiny_pipeline
from engine.pipeline.loading import LoadedPipeline, load_pipeline
from engine.requests import GenerateRequest, LoraSpec
from engine.weights.gguf import GGUFBranchedLinear
from engine.weights.int4 import Int4Linear
from engine.weights.quantized import BranchedLinear, held_branches, stored_bytes
from families.wan import MODEL_ID as WAN
from families.wan22 import MODEL_ID as A14B
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.images import assert_images_close, level_difference
from tests.support.wan import FRAMES, MODULES, PROMPT, factors, lora_file

pytest.importorskip("torchao")
pytest.importorskip("gguf")

GROUP = 32
LORA = "wan_peft.safetensors"
WIDE = "wan_wide.safetensors"  # rank 8: over the branches' 4
SCALES = {"transformer": 0.9, "transformer_2": 0.4}
STORAGES = ("fp8", "int4", "gguf")


def wide_transformer(seed: int) -> WanTransformer3DModel:
    """Wan's tiny transformer, 64 wide with a feed-forward 128 wide."""
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=32,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=128,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def wide_folder(spec: FamilySpec, root: Path) -> Path:
    """The family's tiny pipeline with each stored transformer rebuilt 64 wide (seeded apart), as a folder."""
    tiny = ensure_tiny_pipeline(root / "tiny", model_id=str(spec.identity.tiny_id))
    pipe: Any = spec.pipeline_class.from_pretrained(str(tiny))
    pipe.register_modules(**{c: wide_transformer(3 + i) for i, c in enumerate(spec.stored)})
    pipe.save_pretrained(str(root / "wide"))
    return root / "wide"


# diffusers' names -> Wan's original ones (QuantStack's GGUF files), in order: the inverse of diffusers'
# `convert_wan_transformer_to_diffusers` renames (norm2 and norm3 swapped through a placeholder, as there).
_TO_ORIGINAL = (
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn1", "self_attn"),
    ("attn2", "cross_attn"),
    (".to_out.0.", ".o."),
    (".to_q.", ".q."),
    (".to_k.", ".k."),
    (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    ("norm2", "norm__placeholder"),
    ("norm3", "norm2"),
    ("norm__placeholder", "norm3"),
    ("proj_out", "head.head"),
)


def original_names(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Wan transformer's weights in Wan's original names; checked against diffusers' own single-file converter,
    which must give the diffusers names back."""
    renamed = {}
    for name, tensor in state_dict.items():
        for theirs, ours in _TO_ORIGINAL:
            name = name.replace(theirs, ours)
        if name.endswith("scale_shift_table"):
            name = "head.modulation" if name == "scale_shift_table" else name.replace("scale_shift_table", "modulation")
        renamed[name] = tensor
    assert "head.modulation" in renamed and "blocks.0.self_attn.q.weight" in renamed
    assert set(convert_wan_transformer_to_diffusers(dict(renamed))) == set(state_dict)
    return renamed


def gguf_files(folder: Path, spec: FamilySpec, root: Path, *, original: bool = False) -> list[Path]:
    """Each stored transformer's weights as a Q8_0 GGUF file (norms and biases in F32), diffusers' names, or
    Wan's original ones (`original`, as QuantStack's Wan GGUF files name them)."""
    from tests.support.gguf import Q, write_gguf

    root.mkdir(parents=True, exist_ok=True)
    files = []
    for component in spec.stored:
        weights = WanTransformer3DModel.from_pretrained(str(folder), subfolder=component).state_dict()
        weights = original_names(weights) if original else weights
        files.append(write_gguf(root / f"{component}.gguf", weights, Q.Q8_0, plain=("norm",)))
    return files


def write_loras(transformer: nn.Module, folder: Path) -> None:
    save_lora(folder / LORA, lora_file(factors(transformer, MODULES, seed=51), "peft", None))
    save_lora(folder / WIDE, lora_file(factors(transformer, MODULES[:4], rank=8, seed=52), "peft", None))


def settings_for(base_settings: Any, spec: FamilySpec, folder: Path, storage: str, files: list[Path], **more: Any):
    if storage == "gguf":
        paths = {"gguf": str(files[0]), "gguf_2": str(files[1]) if len(files) > 1 else None}
        more |= {"gguf_dir": files[0].parent, **paths, "quantize": "off"}
    else:
        more |= {"quantize": storage, "int4_group_size": GROUP}
    return base_settings.replace(model_id=str(folder), base_model_id=spec.identity.model_id, lora_max_rank=4, **more)


def request(spec: FamilySpec, *, lora: bool = True, steps: int = 3) -> GenerateRequest:
    scale_2 = {"scale_2": SCALES["transformer_2"]} if spec.second_stage else {}
    loras = (LoraSpec(f"local:{LORA}", scale=SCALES["transformer"], **scale_2),) if lora else ()
    return GenerateRequest(prompt=PROMPT, loras=loras, steps=steps, width=64, height=64, seed=7)


def reference_frames(spec: FamilySpec, folder: Path, loras: Path, storage: str, files: list[Path], checked) -> list:
    """diffusers' own pipeline on the same stored weights, the LoRA loaded unfused into each transformer through
    PEFT (A14B's low-noise one with `load_into_transformer_2=True`), each at its side's scale."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    replaced = {}
    if storage == "gguf":
        quantization = GGUFQuantizationConfig(compute_dtype=torch.float32)
        replaced = {
            c: WanTransformer3DModel.from_single_file(
                str(path), config=str(folder), subfolder=c, quantization_config=quantization
            )
            for c, path in zip(spec.stored, files, strict=True)
        }
    pipe: Any = spec.pipeline_class.from_pretrained(str(folder), **replaced)
    pipe.set_progress_bar_config(disable=True)
    config = Float8WeightOnlyConfig() if storage == "fp8" else PrototypeInt4WeightOnlyConfig(group_size=GROUP)
    with warnings.catch_warnings():
        # PEFT warns that such a layer cannot merge: the reference never merges (it is the unfused one).
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        for component in spec.stored:
            if storage != "gguf":
                quantize_(getattr(pipe, component), config, filter_fn=lambda m, _: isinstance(m, nn.Linear))
            low = {"load_into_transformer_2": True} if component == "transformer_2" else {}
            pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name=f"a_{component}", **low)
            getattr(pipe, component).set_adapters([f"a_{component}"], weights=[SCALES[component]])
    output = pipe(**spec.call_arguments(checked), generator=torch.Generator("cpu").manual_seed(7), output_type="pil")
    return list(output.frames[0])


def assert_stored(loaded: LoadedPipeline, storage: str) -> None:
    """Every linear of every stored transformer branched, and all of a block's in the storage's own kind."""
    kind = {"fp8": BranchedLinear, "int4": Int4Linear, "gguf": GGUFBranchedLinear}[storage]
    for component in loaded.family.stored:
        linears = {n: m for n, m in getattr(loaded.pipe, component).named_modules() if isinstance(m, nn.Linear)}
        assert all(isinstance(m, BranchedLinear) for m in linears.values()), component
        blocks = [m for n, m in linears.items() if n.startswith("blocks.")]
        assert blocks and all(isinstance(m, kind) for m in blocks), component
        if storage == "fp8":
            assert all(m.weight.dtype == torch.float8_e4m3fn for m in blocks), component


@pytest.mark.timeout(900)
@pytest.mark.parametrize("storage", (*STORAGES, "gguf-original"))
@pytest.mark.parametrize("model_id", [WAN, A14B], ids=["wan", "wan22"])
def test_a_quantized_wan_pool_with_a_lora_is_diffusers_unfused_on_the_same_stored_weights_on_every_frame(
    model_id, storage, base_settings, tmp_path
):
    # `gguf-original`: GGUF files in Wan's original names (QuantStack's), read by diffusers' single-file converter.
    original = storage == "gguf-original"
    storage = "gguf" if original else storage
    spec = family_spec(model_id)
    folder = wide_folder(spec, tmp_path)
    files = gguf_files(folder, spec, tmp_path / "gguf", original=original) if storage == "gguf" else []
    loras = tmp_path / "loras"
    write_loras(WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer"), loras)
    settings = settings_for(base_settings, spec, folder, storage, files, local_lora_dir=loras)
    loaded = load_pipeline(settings, warm=False)
    assert loaded.storage == storage and loaded.branch_rank == 4
    assert_stored(loaded, storage)
    with local_engine(loaded, settings, loras) as engine:
        base = generate(engine, request(spec, lora=False))
        ours = generate(engine, request(spec))
    theirs = reference_frames(spec, folder, loras, storage, files, ours.request)
    assert len(ours.frames) == len(theirs) == FRAMES
    assert level_difference(ours.frames[-1], base.frames[-1]) > 2, "the LoRA must visibly change the video"
    for index, (frame, expected) in enumerate(zip(ours.frames, theirs, strict=True)):
        assert pixels(frame).std() > 1, "a blank frame (NaN latents decode to black)"
        assert_images_close(pixels(frame), pixels(expected), f"{spec.family} {storage}: frame {index}")


def digest(loaded: LoadedPipeline) -> str:
    parts = hashlib.sha256()
    for component in loaded.family.stored:
        for name, data in sorted(stored_bytes(getattr(loaded.pipe, component)).items()):
            parts.update(f"{component}.{name}".encode())
            parts.update(data)
    return parts.hexdigest()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("model_id", [WAN, A14B], ids=["wan", "wan22"])
def test_every_stored_transformers_bytes_hash_identical_after_mixed_swaps_with_refusals(
    model_id, storage, base_settings, tmp_path
):
    spec = family_spec(model_id)
    folder = wide_folder(spec, tmp_path)
    files = gguf_files(folder, spec, tmp_path / "gguf") if storage == "gguf" else []
    loras = tmp_path / "loras"
    write_loras(WanTransformer3DModel.from_pretrained(str(folder), subfolder="transformer"), loras)
    settings = settings_for(base_settings, spec, folder, storage, files, local_lora_dir=loras)
    loaded = load_pipeline(settings, warm=False)
    before = digest(loaded)
    with local_engine(loaded, settings, loras) as engine:
        base = generate(engine, request(spec, lora=False, steps=1)).frames[-1].tobytes()
        refused = 0
        for index in range(8):
            if index % 3 == 2:
                with pytest.raises(LimitExceededError) as caught:
                    generate(engine, GenerateRequest(prompt=PROMPT, loras=(LoraSpec(f"local:{WIDE}"),), steps=1))
                assert caught.value.status == 400
                refused += 1
                continue
            scale_2 = {"scale_2": 0.2 + index / 20} if spec.second_stage else {}
            lora = LoraSpec(f"local:{LORA}", scale=0.5 + index / 10, **scale_2)
            result = generate(engine, GenerateRequest(prompt=PROMPT, loras=(lora,), steps=1, width=64, height=64))
            assert result.swapped
        # Every stored transformer held branches (A14B's low-noise one at its own scale), none ever written.
        assert refused == 2 and digest(loaded) == before
        assert generate(engine, request(spec, lora=False, steps=1)).frames[-1].tobytes() == base
    for component in spec.stored:
        assert held_branches(getattr(loaded.pipe, component)) == [], component


def test_a_gguf_item_naming_another_number_of_files_than_the_base_has_transformers_is_refused(base_settings, tmp_path):
    for model_id, given in ((A14B, 1), (WAN, 2)):
        spec = family_spec(model_id)
        folder = ensure_tiny_pipeline(tmp_path / spec.family.value, model_id=str(spec.identity.tiny_id))
        paths = {"gguf": str(tmp_path / "a.gguf"), "gguf_2": str(tmp_path / "b.gguf") if given == 2 else None}
        settings = base_settings.replace(
            model_id=str(folder), base_model_id=model_id, gguf_dir=tmp_path, quantize="off", **paths
        )
        form = r"MODEL\[=BASE\]@GGUF@GGUF_2" if spec.second_stage else r"MODEL\[=BASE\]@GGUF, one file"
        with pytest.raises(SettingsError, match=rf"names {given} GGUF file\(s\).*accepted: {form}"):
            load_pipeline(settings, warm=False)
