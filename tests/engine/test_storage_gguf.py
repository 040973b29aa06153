"""GGUF sizes in the storage formula (`engine.storage.gguf_bytes`): every block layout is the `gguf` package's, and
a published FLUX.1 / Qwen-Image / Z-Image transformer's size in each type diffusers dequantizes is what its blocks
take, linear by linear, on a meta-device model built from the published config: exactly, from the values a file
stores in each type (its header); from the type alone (a Hub file's name), short by no more than the linears
whose width the type's block does not divide (kept wider in published files)."""

from __future__ import annotations

from collections import Counter

import gguf
import pytest
import torch
from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel, ZImageTransformer2DModel
from torch import nn

from engine.families import flux, qwen_image, zimage
from engine.storage import (
    BRANCH_BYTES,
    OTHER_BYTES,
    bits_per_value,
    fp8_bytes,
    gguf_block,
    gguf_bytes,
    int4_block,
    int4_bytes,
)
from engine.weights.gguf import named_type, served_types
from tests.engine.pools.test_plan_flux import _TRANSFORMER as FLUX_CONFIG
from tests.engine.pools.test_plan_qwen_image import _TRANSFORMER as QWEN_CONFIG


def test_every_served_block_layout_is_the_gguf_package_s():
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    served = {gguf.GGMLQuantizationType(t).name for t in SUPPORTED_GGUF_QUANT_TYPES}
    assert set(served_types()) == {n for n in served if gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[n]][0] > 1}
    for name in served:
        assert gguf_block(name) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    # Fewest bits last: what a refusal tries after a file's own type.
    bits = [bits_per_value(gguf_block(n)) for n in served_types()]
    assert bits == sorted(bits, reverse=True)


_MEMORY = {"flux": flux.FAMILY.memory, "qwen_image": qwen_image.FAMILY.memory, "zimage": zimage.FAMILY.memory}


def _built(family: str) -> nn.Module:
    with torch.device("meta"):
        if family == "flux":
            return FluxTransformer2DModel(**FLUX_CONFIG)
        if family == "qwen_image":
            return QwenImageTransformer2DModel(**QWEN_CONFIG)
        return ZImageTransformer2DModel()


@pytest.mark.parametrize("family", list(_MEMORY))
@pytest.mark.parametrize("quant", served_types())
def test_a_gguf_denoiser_s_size_is_its_blocks_in_every_served_type(family, quant):
    """A file with each linear in `quant` where its block divides the linear's width, in F16 otherwise (as the
    published files keep such linears, loaded in bf16), the rest in F32 (loaded in bf16)."""
    rank = 64
    denoiser = _built(family)
    linears = [m for m in denoiser.modules() if isinstance(m, nn.Linear)]
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]
    fits = [m for m in linears if m.in_features % block[0] == 0]
    blocks = sum(m.out_features * (m.in_features // block[0]) * block[1] for m in fits)
    held = {id(m.weight) for m in fits}
    others = sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()) if id(t) not in held)
    branches = sum(rank * (m.in_features + m.out_features) * BRANCH_BYTES for m in linears)
    exact = blocks + others * OTHER_BYTES + branches
    # The family's declared sizes, as the plan reads them before loading.
    memory = _MEMORY[family]
    assert memory.linears is not None
    values = memory.values_of(("transformer",))
    assert values == sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()))
    # From a header: the values the file stores in each type.
    header = Counter({quant: sum(m.weight.numel() for m in fits), "F32": others})
    assert gguf_bytes(values, memory.linears, rank, header) == exact
    # From a name: every linear in that type, short by at most the narrow linears' bf16 over their blocks.
    narrow = sum(m.weight.numel() for m in linears if m not in fits)
    by_name = gguf_bytes(values, memory.linears, rank, quant)
    assert by_name <= exact <= by_name + narrow * OTHER_BYTES


@pytest.mark.parametrize("family", list(_MEMORY))
def test_storages_order_by_their_bits_per_value(family):
    memory = _MEMORY[family]
    assert memory.linears is not None
    values, linears = memory.values_of(("transformer",)), memory.linears
    # Q4_K (4.5 bits) over int4 in groups of 128 (4.25) under fp8 (8 bits and a scale a row) under Q8_0 (8.5).
    assert bits_per_value(gguf_block("Q4_K")) > bits_per_value(int4_block(128))
    assert (
        int4_bytes(values, linears, 128, 128)
        < gguf_bytes(values, linears, 128, "Q4_K")
        < fp8_bytes(values, linears, 128)
        < gguf_bytes(values, linears, 128, "Q8_0")
    )


def test_the_type_a_file_s_name_says():
    said = {
        "flux1-dev-Q4_K_S.gguf": "Q4_K",
        "flux1-dev-Q8_0.gguf": "Q8_0",
        "Qwen_Image-Q4_K_M.gguf": "Q4_K",
        "z_image_turbo-Q5_0.gguf": "Q5_0",
        "model-IQ4_XS.gguf": "IQ4_XS",
        "flux1-dev-BF16.gguf": "BF16",
        "flux1-dev-F16.gguf": "F16",
        "flux1-dev.gguf": None,
        "flux1-dev-Q4_K-and-Q8_0.gguf": None,
    }
    assert {name: named_type(name) for name in said} == said
