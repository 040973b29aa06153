"""Krea 2 on the tiny Krea 2 Turbo pipeline: its structure and both bases' defaults; kohya names diffusers refuses,
loaded, and one that spells no layer refused by name; LyCORIS (LoKr, LoHa) in the original names, and on the
original fused `attn.qkv` split per projection, equal to the LyCORIS package's own module on the fused layer.
Its namings against diffusers' fuse and its base bit-exact after swaps: test_swaps.py (tests/support/krea2.py);
its pools, routing and concurrent clients: tests/engine/pools/test_pools_krea2.py."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from diffusers import Krea2Pipeline
from torch import nn

from engine.errors import IncompatibleLoraError
from engine.families.krea2 import FAMILY, convert_lora, defaults
from engine.families.registry import family_spec
from engine.formats.targets import TargetTable
from engine.requests import LoraSpec
from families.krea2 import MODEL_ID, RAW_ID
from lora_catalog.bases import KNOWN_BASES
from lora_catalog.entries import Family
from serving.demo.synthetic import save_lora
from tests.support.checks import generate
from tests.support.dit import pool_request
from tests.support.formats import load
from tests.support.krea2 import factors, lora_file

lycoris_modules = pytest.importorskip("lycoris.modules")


def test_the_tiny_krea2_pipeline_has_krea2_turbos_structure_and_both_bases_their_defaults(loaded_krea2):
    pipe = loaded_krea2.pipe
    assert type(pipe) is Krea2Pipeline and loaded_krea2.family is FAMILY and pipe.config.is_distilled
    assert family_spec(MODEL_ID) is FAMILY and family_spec(RAW_ID) is FAMILY
    # The catalogue's base filter lists both.
    assert {b.repo_id for b in KNOWN_BASES if b.family is Family.KREA2} == {MODEL_ID, RAW_ID}
    assert type(pipe.text_encoder).__name__ == "Qwen3VLModel" and loaded_krea2.components == ("transformer",)
    # Turbo's 8 steps without CFG; an undistilled pipeline (Raw's) Krea2Pipeline's own 28 at 4.5.
    assert (defaults(pipe).steps, defaults(pipe).guidance) == (8, 0.0)
    raw = SimpleNamespace(config=SimpleNamespace(is_distilled=False), patch_size=2, vae_scale_factor=8)
    assert (defaults(raw).steps, defaults(raw).guidance, defaults(raw).side_multiple) == (28, 4.5, 16)


def test_a_kohya_name_that_spells_no_krea2_layer_is_refused_by_name(loaded_krea2):
    made = lora_file(factors(loaded_krea2.pipe.transformer, seed=3), "kohya", 4.0)
    made["lora_unet_blocks_0_attn_wz.lora_down.weight"] = torch.ones(4, 104)
    made["lora_unet_blocks_0_attn_wz.lora_up.weight"] = torch.ones(104, 4)
    with pytest.raises(ValueError, match=r"spell no layer of Krea 2's transformer: \['lora_unet_blocks_0_attn_wz'\]"):
        convert_lora(made, loaded_krea2.pipe.transformer)


# -- LyCORIS, against the LyCORIS package's modules -------------------------------------------------------------

QKV = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v")


def lycoris_tensors(module: nn.Module, stem: str, seed: int) -> dict[str, torch.Tensor]:
    """A LyCORIS module's own parameters, filled at random, and its alpha, under `stem`."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, parameter in module.named_parameters():
        if name.startswith(("lokr_", "hada_")):
            values = torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5
            with torch.no_grad():
                parameter.copy_(values)
            tensors[f"{stem}.{name}"] = values
    tensors[f"{stem}.alpha"] = torch.tensor(float(module.alpha))
    return tensors


def fused_weights(path: Path, transformer: nn.Module, scale: float) -> dict[str, torch.Tensor]:
    """The weights the engine's swap makes for the file at `scale`, by module name (the table restored after)."""
    from engine.weights.swap import ActiveAdapter, WeightPatcher

    table = TargetTable(
        {"transformer": transformer},
        denoiser="transformer",
        convert_lora=FAMILY.convert_lora,
        lycoris_modules=FAMILY.lycoris_modules,
    )
    adapter = load(path, table)
    patcher = WeightPatcher(table.params, torch.device("cpu"))
    patcher.apply([ActiveAdapter(adapter, scale)])
    out = {table.names[layer.target].removeprefix("transformer."): table.params[layer.target].detach().clone()
           for layer in adapter.layers}  # fmt: skip
    patcher.restore_all()
    return out


def lycoris_over(make, layer: nn.Module, **options) -> tuple[nn.Module, nn.Module]:
    """A LyCORIS module (`make`: LokrModule, LohaModule) over a float64 copy of `layer`, and that copy."""
    org = copy.deepcopy(layer).double()
    return make("x", org, 1.0, lora_dim=4, **options).double(), org


def assert_same_output(module: nn.Module, org: nn.Module, weight: torch.Tensor, scale: float) -> None:
    """The LyCORIS module's output over the original layer equals ours through the fused weight (float64: the
    file's float32 values widened exactly)."""
    module.multiplier = scale
    x = torch.randn((3, org.in_features), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        reference, mine = module(x), F.linear(x, weight.double(), None)
        assert (reference - org(x)).abs().max() > 1e-3, "the adapter must change the output"
    torch.testing.assert_close(mine, reference, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("stem", ["lora_unet_blocks_0_attn_qkv", "diffusion_model.blocks.0.attn.qkv"])
@pytest.mark.parametrize(("kind", "options"), [("lokr", {"factor": 4}), ("lokr", {"factor": -1}), ("loha", {})])
def test_lycoris_on_the_fused_qkv_is_split_per_projection_as_lycoris_computes_it(
    loaded_krea2, tmp_path, stem, kind, options
):
    transformer = loaded_krea2.pipe.transformer
    parts = [transformer.get_submodule(m) for m in QKV]
    org = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=False)
    with torch.no_grad():
        org.weight.copy_(torch.cat([p.weight for p in parts]))
    make = lycoris_modules.LokrModule if kind == "lokr" else lycoris_modules.LohaModule
    module, org = lycoris_over(make, org, alpha=2.0, **options)
    path = save_lora(tmp_path / f"{kind}.safetensors", lycoris_tensors(module, stem, seed=7))
    ours = fused_weights(path, transformer, 0.8)
    assert sorted(ours) == sorted(QKV)
    assert_same_output(module, org, torch.cat([ours[m] for m in QKV]), 0.8)


def test_lokr_in_the_original_names_of_one_layer_matches_lycoris(loaded_krea2, tmp_path):
    transformer = loaded_krea2.pipe.transformer
    layer = transformer.get_submodule("transformer_blocks.1.ff.down")
    module, org = lycoris_over(lycoris_modules.LokrModule, layer, alpha=3.0, factor=8)
    stem = "diffusion_model.blocks.1.mlp.down"
    path = save_lora(tmp_path / "lokr.safetensors", lycoris_tensors(module, stem, seed=8))
    ours = fused_weights(path, transformer, -0.7)
    assert_same_output(module, org, ours["transformer_blocks.1.ff.down"], -0.7)


@pytest.fixture
def krea2_engine(family_engine, tmp_path):
    return family_engine(Family.KREA2, tmp_path)


def test_a_fused_qkv_lokr_runs_on_the_pool_and_one_of_another_shape_is_refused_naming_the_layers(
    krea2_engine, loaded_krea2, tmp_path
):
    parts = [loaded_krea2.pipe.transformer.get_submodule(m) for m in QKV]
    org = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=False)
    module = lycoris_modules.LokrModule("x", org, 1.0, lora_dim=4, alpha=2.0, factor=4)
    save_lora(tmp_path / "fused.safetensors", lycoris_tensors(module, "lora_unet_blocks_0_attn_qkv", seed=9))
    base = generate(krea2_engine, pool_request()).image.tobytes()
    result = generate(krea2_engine, pool_request(LoraSpec("local:fused.safetensors")))
    assert result.image.tobytes() != base
    # Made for a fused q/k/v as wide out as three times the hidden width (no grouped-query attention).
    square = lycoris_modules.LokrModule("x", nn.Linear(104, 3 * 104, bias=False), 1.0, lora_dim=4, factor=4)
    save_lora(tmp_path / "square.safetensors", lycoris_tensors(square, "lora_unet_blocks_0_attn_qkv", seed=10))
    with pytest.raises(IncompatibleLoraError, match=r"transformer_blocks\.0\.attn\.to_q, .*to_k, .*to_v\)"):
        generate(krea2_engine, pool_request(LoraSpec("local:square.safetensors")))
    krea2_engine.restore_base_weights()
    assert generate(krea2_engine, pool_request()).image.tobytes() == base
