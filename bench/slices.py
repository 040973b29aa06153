"""What the real-width transformer slices share: the slice built, the Linear layers its LoRAs adapt, the LoRA pair.

Each family's module (`bench.qwen_slice`, `bench.krea2_slice`, `bench.ltx2_slice`, `bench.wan_slice`;
`bench.flux_slice` for its build) keeps its own facts: the real model's config cut to a few blocks, its class, the
block layers its trainers adapt and how they name them (`SliceLora`). The rest is written once here, so that every
family's slice is built and its LoRAs drawn the same way: the slice's tensors cut from one pool
(`bench.sdxl_unet.build_filled`), and each LoRA file's weights drawn from its own seed (2 x rank + 1 for file a,
+ 2 for file b), so both can be regenerated bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from serving.demo.synthetic import kohya_metadata, save_lora

from .ours import LoraPair
from .sdxl_unet import build_filled

__all__ = [
    "FORMATS",
    "SliceLora",
    "block_targets",
    "build_slice",
    "kohya_base",
    "original_name",
    "reference_pipeline",
    "unet_stem",
    "write_slice_pair",
]

# The LoRA files' formats: a trainer's own names ("kohya") and diffusers' ("peft").
FORMATS = ("peft", "kohya")


@dataclass(frozen=True)
class SliceLora:
    """How one family's trainers write a LoRA file.

    `kohya_stem` gives a diffusers module's stem in the trainer's file (its `lora_down`, `lora_up` and `.alpha`
    under it); None where the trainer keeps diffusers' `lora_A`/`lora_B` names under `diffusion_model.` (LTX-2's).
    `peft_metadata` says whether diffusers-named files carry their `lora_adapter_metadata` (ai-toolkit's Krea 2
    files do not).
    """

    family: str
    kohya_stem: Callable[[str], str] | None
    kohya_metadata: Callable[[int], dict[str, str]]
    peft_metadata: bool = True


def build_slice(
    model_class: Any,
    default: dict[str, Any],
    config: dict[str, Any] | None,
    *,
    dtype: torch.dtype,
    device: torch.device,
    pool: torch.Tensor,
) -> Any:
    """`model_class` built from `config` (the family's slice, `default`, when None), every tensor filled from
    `pool`."""
    return build_filled(model_class, config if config is not None else default, dtype=dtype, device=device, pool=pool)


def block_targets(transformer: torch.nn.Module, blocks: str, layers: Iterable[str]) -> list[tuple[str, int, int]]:
    """(module, in features, out features) of each of `layers` in every block of `transformer.<blocks>`, block by
    block."""
    targets = []
    for index in range(len(transformer.get_submodule(blocks))):  # type: ignore[arg-type]
        for layer in layers:
            name = f"{blocks}.{index}.{layer}"
            module = transformer.get_submodule(name)
            targets.append((name, int(module.in_features), int(module.out_features)))
    return targets


def original_name(module: str, layers: Mapping[str, str]) -> str:
    """A block's diffusers module (`<blocks>.N.<layer>`) under the original model's name, `blocks.N.<original>`."""
    _, index, layer = module.split(".", 2)
    return f"blocks.{index}.{layers[layer]}"


def unet_stem(name: str) -> str:
    """kohya's and musubi-tuner's stem for a module: `lora_unet_` and its name, underscored."""
    return "lora_unet_" + name.replace(".", "_")


def kohya_base(base_version: str) -> Callable[[int], dict[str, str]]:
    """The metadata kohya's trainers write for a LoRA of a rank (alpha = rank) on `base_version`."""
    return lambda rank: kohya_metadata(dim=rank, alpha=float(rank), base_version=base_version)


def write_slice_pair(
    folder: Path, targets: Sequence[tuple[str, int, int]], lora: SliceLora, *, rank: int, fmt: str
) -> LoraPair:
    """Two LoRA files of `rank` on `targets` ((module, in, out) each) in `fmt` ("kohya": the trainer's names as
    `lora` says, with its metadata; "peft": diffusers' names), float16, as trainers save them."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown LoRA format {fmt!r}; accepted: {', '.join(FORMATS)}")
    paths = []
    for name, seed in (("a", 2 * rank + 1), ("b", 2 * rank + 2)):
        tensors = _lora_tensors(targets, lora, rank=rank, fmt=fmt, seed=seed)
        path = folder / f"{lora.family}-r{rank}-{fmt}-{name}.safetensors"
        paths.append(save_lora(path, tensors, _metadata(lora, rank, fmt, targets)))
    return LoraPair(rank, fmt, (paths[0], paths[1]))


def _lora_tensors(
    targets: Sequence[tuple[str, int, int]], lora: SliceLora, *, rank: int, fmt: str, seed: int
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for module, fan_in, fan_out in targets:
        down = torch.randn((rank, fan_in), generator=generator) / fan_in**0.5
        up = torch.randn((fan_out, rank), generator=generator) * (0.3 / rank**0.5)
        if fmt == "kohya" and lora.kohya_stem is not None:
            stem = lora.kohya_stem(module)
            tensors[f"{stem}.lora_down.weight"], tensors[f"{stem}.lora_up.weight"] = down, up
            tensors[f"{stem}.alpha"] = torch.tensor(float(rank))
        else:
            prefix = "diffusion_model" if fmt == "kohya" else "transformer"
            tensors[f"{prefix}.{module}.lora_A.weight"] = down
            tensors[f"{prefix}.{module}.lora_B.weight"] = up
    return {key: value.to(torch.float16) for key, value in tensors.items()}


def _metadata(lora: SliceLora, rank: int, fmt: str, targets: Sequence[tuple[str, int, int]]) -> dict[str, str] | None:
    if fmt == "kohya":
        return lora.kohya_metadata(rank)
    if not lora.peft_metadata:
        return None
    config = {
        "transformer.r": rank,
        "transformer.lora_alpha": rank,
        "transformer.rank_pattern": {},
        "transformer.alpha_pattern": {},
        "transformer.target_modules": sorted(module for module, *_ in targets),
    }
    return {"format": "pt", "lora_adapter_metadata": json.dumps(config)}


def reference_pipeline(pipeline_class: Any, tiny: Any, transformer: torch.nn.Module, **config: Any) -> Any:
    """diffusers' `pipeline_class` around the slice, every other part `tiny`'s (a tiny pipeline of the family: the
    LoRAs only touch the transformer), with `config` (the pipeline's own arguments), its progress bar off."""
    pipe = pipeline_class(**{**tiny.components, "transformer": transformer, **config})
    pipe.set_progress_bar_config(disable=True)
    return pipe
