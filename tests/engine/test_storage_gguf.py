"""GGUF sizes in the storage formula (`engine.storage.gguf_bytes`): the block layouts are the `gguf` package's, and
the size of a published FLUX.1 / Qwen-Image / Z-Image transformer in Q8_0 (every linear's input a multiple of 32)
is what its blocks take, linear by linear, on a meta-device model built from the published config."""

from __future__ import annotations

import gguf
import pytest
import torch
from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel, ZImageTransformer2DModel
from torch import nn

from engine.families import flux, qwen_image, zimage
from engine.storage import BRANCH_BYTES, GGUF_BLOCKS, OTHER_BYTES, fp8_bytes, gguf_bytes, linear_sizes
from tests.engine.pools.test_plan_flux import _TRANSFORMER as FLUX_CONFIG
from tests.engine.pools.test_plan_qwen_image import _TRANSFORMER as QWEN_CONFIG


def test_the_block_layouts_are_the_gguf_packages():
    assert {name: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] for name in GGUF_BLOCKS} == GGUF_BLOCKS


def _built(family: str) -> tuple[nn.Module, object]:
    with torch.device("meta"):
        if family == "flux":
            return FluxTransformer2DModel(**FLUX_CONFIG), flux.FAMILY.memory
        if family == "qwen_image":
            return QwenImageTransformer2DModel(**QWEN_CONFIG), qwen_image.FAMILY.memory
        return ZImageTransformer2DModel(), zimage.FAMILY.memory


@pytest.mark.parametrize("family", ["flux", "qwen_image", "zimage"])
@pytest.mark.parametrize("rank", [16, 128])
def test_a_q8_0_denoiser_s_size_is_its_blocks(family, rank):
    denoiser, memory = _built(family)
    linears = [m for m in denoiser.modules() if isinstance(m, nn.Linear)]
    assert all(m.in_features % 32 == 0 for m in linears)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    blocks = sum(m.out_features * (m.in_features // block) * size for m in linears)
    weights = {id(m.weight) for m in linears}
    others = sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()) if id(t) not in weights)
    branches = sum(rank * (m.in_features + m.out_features) * BRANCH_BYTES for m in linears)
    sizes = linear_sizes(
        ((n, m.out_features, m.in_features) for n, m in denoiser.named_modules() if m in linears), None
    )
    values = sum(t.numel() for t in (*denoiser.parameters(), *denoiser.buffers()))
    assert gguf_bytes(values, sizes, rank, "Q8_0") == blocks + others * OTHER_BYTES + branches
    # The family's declared sizes give the same (its branches on the modules LoRAs may target).
    declared = memory.linears  # type: ignore[attr-defined]
    assert declared is not None and declared.values == sizes.values
    # Q4_K (4.5 bits a value) under fp8 (8 bits and a scale a row) under Q8_0 (8.5 bits a value).
    assert (
        gguf_bytes(values, sizes, rank, "Q4_K")
        < fp8_bytes(values, sizes, rank)
        < gguf_bytes(values, sizes, rank, "Q8_0")
    )
