"""Tiny GGUF files for the tests, written with the `gguf` package (GGUFWriter, `gguf.quants.quantize`).

`gguf.quants` quantizes the standard block types (Q8_0, Q4_0, Q5_0, ...: 32 values a block) but no K-quant (256
values a block); `q4_k_blocks` packs Q4_K blocks itself (a plain min/max fit per 32-value sub-block, 6-bit
scales and mins per 256-value block, as llama.cpp lays them out: d, dmin, 12 bytes of scales, 128 of nibbles).
Whatever the fit, the test's references read the same blocks through diffusers' own dequantization.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

__all__ = ["Q", "q4_k_blocks", "write_gguf"]

_K = 256


def q4_k_blocks(weight: np.ndarray) -> np.ndarray:
    """`weight` (rows x in, in a multiple of 256) as Q4_K blocks: uint8 rows x (in / 256 * 144)."""
    rows, width = weight.shape
    x = weight.astype(np.float32).reshape(-1, 8, 32)  # blocks x sub-blocks x values
    low = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - low) / 15.0
    d = np.maximum(scale.max(axis=1), 1e-12) / 63.0
    dmin = np.maximum((-low).max(axis=1), 1e-12) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    sc = np.clip(np.rint(scale / d16.astype(np.float32)[:, None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.rint(-low / dmin16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    step = (d16.astype(np.float32)[:, None] * sc)[:, :, None]
    offset = (dmin16.astype(np.float32)[:, None] * mn)[:, :, None]
    q = np.clip(np.rint((x + offset) / step), 0, 15).astype(np.uint8)
    # Sub-blocks 2i and 2i+1 share bytes 32i..32i+31: the first in the low nibbles.
    nibbles = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    packed = np.zeros((x.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    head = np.stack([d16, dmin16], axis=1).view(np.uint8)
    return np.concatenate([head, packed, nibbles], axis=1).reshape(rows, width // _K * 144)


def write_gguf(path: Path, tensors: Mapping[str, torch.Tensor], quant: Q, *, plain: tuple[str, ...] = ()) -> Path:
    """Write `tensors` to a GGUF file at `path`: each 2-D `.weight` whose width fits `quant`'s block in `quant`
    (Q4_K by `q4_k_blocks`, the standard types by `gguf.quants`), falling back to Q8_0 where only its 32-value
    block fits; the rest (biases, norms, pad tokens), and names containing a string of `plain`, in F32, as the
    published files keep them."""
    writer = gguf.GGUFWriter(str(path), "tiny")
    for name, tensor in tensors.items():
        values = tensor.detach().float().cpu().numpy()
        weight = name.endswith(".weight") and not any(p in name for p in plain)
        chosen = _type_of(values, quant) if weight else None
        if chosen is None:
            writer.add_tensor(name, values)
        elif chosen == Q.Q4_K:
            writer.add_tensor(name, q4_k_blocks(values), raw_dtype=chosen)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, chosen), raw_dtype=chosen)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _type_of(values: np.ndarray, quant: Q) -> Q | None:
    if values.ndim != 2:
        return None
    block, _ = gguf.GGML_QUANT_SIZES[quant]
    if values.shape[1] % block == 0:
        return quant
    return Q.Q8_0 if values.shape[1] % 32 == 0 else None
