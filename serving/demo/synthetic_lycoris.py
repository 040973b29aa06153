"""Synthetic LoHa, LoKr and DoRA files, in the kohya names LyCORIS writes and in PEFT's names.

Companions of `serving.demo.synthetic` for the tests and the benchmark: random factors for a pipeline's real
modules with the tensor layouts of LyCORIS 4.1.3 and PEFT (they agree); kohya names carry `.alpha`, PEFT names
diffusers-style `lora_adapter_metadata`. Each ΔW is about `strength` of the weight's scale. The layouts, tensor
by tensor: docs/internals.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import nn

from serving.demo.synthetic import Format, LoraTarget, _file_module_name, kohya_key, make_lora

__all__ = ["Variant", "factorization", "lycoris_metadata", "make_dora", "make_loha", "make_lokr"]

Variant = Literal["loha", "lokr", "dora"]


def factorization(dimension: int, factor: int = -1) -> tuple[int, int]:
    """LyCORIS's split of a dimension into (small, large) for LoKr (`lycoris/functional/general.py` 17-59)."""
    if factor > 0 and dimension % factor == 0:
        m, n = factor, dimension // factor
        return (n, m) if m > n else (m, n)
    if factor < 0:
        factor = dimension
    m, n = 1, dimension
    length = m + n
    while m < n:
        new_m = m + 1
        while dimension % new_m != 0:
            new_m += 1
        new_n = dimension // new_m
        if new_m + new_n > length or new_m > factor:
            break
        m, n = new_m, new_n
    return (n, m) if m > n else (m, n)


def _stem(target: LoraTarget, fmt: Format, layers_per_block: int) -> str:
    return kohya_key(target, layers_per_block) if fmt == "kohya" else f"{target.component}.{_file_module_name(target)}"


def _fan_in(target: LoraTarget) -> int:
    return int(torch.Size(target.weight_shape[1:]).numel())


def make_loha(
    targets: Sequence[LoraTarget],
    *,
    rank: int,
    seed: int,
    fmt: Format = "kohya",
    alpha: float | None = None,
    tucker: bool = False,
    strength: float = 0.2,
    dtype: torch.dtype = torch.float16,
    layers_per_block: int = 2,
) -> dict[str, torch.Tensor]:
    """Random LoHa factors; `tucker` gives 3x3 convolutions Tucker cores (`use_tucker` / `use_effective_conv2d`)."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for target in targets:
        stem = _stem(target, fmt, layers_per_block)
        out_ch, in_ch, *kernel = target.weight_shape
        size = (strength / _fan_in(target) ** 0.5) ** 0.5  # each half's product about sqrt of the ΔW's scale
        for half in ("1", "2"):
            if tucker and kernel and kernel != [1, 1]:
                tensors[f"{stem}.hada_t{half}"] = torch.randn((rank, rank, *kernel), generator=generator) / rank
                tensors[f"{stem}.hada_w{half}_a"] = torch.randn((rank, out_ch), generator=generator) * size
                tensors[f"{stem}.hada_w{half}_b"] = torch.randn((rank, in_ch), generator=generator)
            else:
                a = torch.randn((out_ch, rank), generator=generator) * (size / rank**0.5)
                tensors[f"{stem}.hada_w{half}_a"] = a
                tensors[f"{stem}.hada_w{half}_b"] = torch.randn((rank, _fan_in(target)), generator=generator)
        if fmt == "kohya":
            tensors[f"{stem}.alpha"] = torch.tensor(float(rank if alpha is None else alpha))
    return {k: v.to(dtype) for k, v in tensors.items()}


def make_lokr(
    targets: Sequence[LoraTarget],
    *,
    rank: int,
    seed: int,
    fmt: Format = "kohya",
    alpha: float | None = None,
    factor: int = -1,
    whole: bool | None = None,
    tucker: bool = False,
    strength: float = 0.2,
    dtype: torch.dtype = torch.float16,
    layers_per_block: int = 2,
) -> dict[str, torch.Tensor]:
    """Random LoKr factors: `lokr_w1` whole, `lokr_w2` factored at `rank` or whole (Tucker-factored on 3x3 when asked).

    `whole=None` decides as LyCORIS does: `lokr_w2` is whole when `rank >= max(b, d) / 2` (`modules/lokr.py` 165).
    """
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for target in targets:
        stem = _stem(target, fmt, layers_per_block)
        out_ch, in_ch, *kernel = target.weight_shape
        (a, b), (c, d) = factorization(out_ch, factor), factorization(in_ch, factor)
        tensors[f"{stem}.lokr_w1"] = torch.randn((a, c), generator=generator)
        size = strength / _fan_in(target) ** 0.5
        if whole or (whole is None and rank >= max(b, d) / 2):
            tensors[f"{stem}.lokr_w2"] = torch.randn((b, d, *kernel), generator=generator) * size
        elif tucker and kernel and kernel != [1, 1]:
            tensors[f"{stem}.lokr_t2"] = torch.randn((rank, rank, *kernel), generator=generator) / rank
            tensors[f"{stem}.lokr_w2_a"] = torch.randn((rank, b), generator=generator) * size
            tensors[f"{stem}.lokr_w2_b"] = torch.randn((rank, d), generator=generator)
        else:
            tensors[f"{stem}.lokr_w2_a"] = torch.randn((b, rank), generator=generator) * (size / rank**0.5)
            tensors[f"{stem}.lokr_w2_b"] = torch.randn((rank, d * int(torch.Size(kernel).numel())), generator=generator)
        if fmt == "kohya":
            tensors[f"{stem}.alpha"] = torch.tensor(float(rank if alpha is None else alpha))
    return {k: v.to(dtype) for k, v in tensors.items()}


def make_dora(
    targets: Sequence[LoraTarget],
    base: Mapping[str, nn.Module],
    *,
    rank: int,
    seed: int,
    fmt: Format = "peft",
    alpha: float | None = None,
    on_output: bool = True,
    strength: float = 0.2,
    dtype: torch.dtype = torch.float16,
    layers_per_block: int = 2,
) -> dict[str, torch.Tensor]:
    """A LoRA with DoRA magnitudes near the norms of the `base` weights (kohya `dora_scale` may be per input)."""
    tensors = make_lora(
        targets,
        rank=rank,
        seed=seed,
        fmt=fmt,
        alpha=alpha,
        strength=strength,
        dtype=dtype,
        layers_per_block=layers_per_block,
    )
    generator = torch.Generator().manual_seed(seed + 1)
    for target in targets:
        weight = base[target.component].get_parameter(f"{target.module}.weight").detach().float()
        rows = weight.reshape(weight.shape[0], -1)
        stem = _stem(target, fmt, layers_per_block)
        ones = (1,) * (weight.dim() - 2)
        if fmt == "peft":
            norm = rows.norm(dim=1)
            shape: tuple[int, ...] = (1, -1, *ones) if ones else (-1,)
            name = f"{stem}.lora_magnitude_vector"
        elif on_output:
            norm, shape, name = rows.norm(dim=1), (-1, 1, *ones), f"{stem}.dora_scale"
        else:
            norm = weight.transpose(0, 1).reshape(weight.shape[1], -1).norm(dim=1)
            shape, name = (1, -1, *ones), f"{stem}.dora_scale"
        jitter = 1 + 0.1 * torch.randn(norm.shape, generator=generator)
        tensors[name] = (norm * jitter).reshape(shape).to(dtype)
    return tensors


def lycoris_metadata(
    variant: Variant, targets: Sequence[LoraTarget], *, fmt: Format, rank: int, alpha: float
) -> dict[str, str]:
    """kohya: what sd-scripts writes with `--network_module lycoris.kohya`; PEFT: diffusers-style adapter config."""
    if fmt == "kohya":
        algo = {"loha": "loha", "lokr": "lokr", "dora": "locon"}[variant]
        args = {"algo": algo, **({"dora_wd": "True"} if variant == "dora" else {})}
        return {
            "ss_network_module": "lycoris.kohya",
            "ss_network_dim": str(rank),
            "ss_network_alpha": str(alpha),
            "ss_network_args": json.dumps(args),
            "ss_base_model_version": "sdxl_base_v1-0",
            "modelspec.architecture": "stable-diffusion-xl-v1-base/lora",
        }
    peft_type = {"loha": "LOHA", "lokr": "LOKR", "dora": "LORA"}[variant]
    alpha_key = "lora_alpha" if variant == "dora" else "alpha"
    config: dict[str, object] = {}
    for component in sorted({t.component for t in targets}):
        modules = sorted({t.module for t in targets if t.component == component})
        config |= {
            f"{component}.peft_type": peft_type,
            f"{component}.r": rank,
            f"{component}.{alpha_key}": alpha,
            f"{component}.target_modules": modules,
        }
        if variant == "dora":
            config[f"{component}.use_dora"] = True
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}
