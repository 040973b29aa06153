"""Which adapter variants the engine cannot fuse, told from tensor names alone (no torch, no tensor data).

The catalogue marks such LoRAs "not supported" from a file header, before anyone presses Generate;
the engine refuses the same files with the same variant name. Plain LoRA, LoHa, LoKr, LoCon (with
or without a Tucker core) and DoRA are supported and never match here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from .entries import LoraEntry

__all__ = ["UNSUPPORTED_VARIANTS", "mark_unsupported", "unsupported_variant", "variant_tensors"]

# (tensor-name pattern, variant name): LyCORIS module names (`lycoris/modules/*.py` weight_list) and PEFT's.
UNSUPPORTED_VARIANTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"\.(oft_blocks|oft_diag)$|\.oft_R(\.weight)?$|\.oft_s$", "OFT"),
        (r"\.boft_[Rs](\.weight)?$", "BOFT"),
        (r"\.on_input$|\.ia3_l(\.weight)?$", "IA3"),
        (r"\.diff(_b)?$", "full weight differences"),
        (r"\.(a1|a2|b1|b2|bm)\.weight$", "GLoRA"),
        (r"\.[wb]_norm$", "norm-layer fine-tuning"),
        (r"\.(q_layer|p_layer)\.weight$|\.lambda_layer$", "T-LoRA"),
        (r"\.lokr_t1$", "a LoKr Tucker core on the first factor"),
        (r"(lora_B|lora_up|lora_down|lora_A)\.bias$|\.bias_(indices|values)$", "LoRA bias terms"),
    )
)


def unsupported_variant(tensor_names: Iterable[str]) -> str | None:
    """The name of the first unsupported variant the tensor names belong to, or None when all can be fused."""
    for name in tensor_names:
        for pattern, variant in UNSUPPORTED_VARIANTS:
            if pattern.search(name):
                return variant
    return None


def variant_tensors(tensor_names: Iterable[str], variant: str) -> list[str]:
    """The tensor names that belong to `variant` (as `unsupported_variant` named it), sorted: what a refusal names."""
    patterns = [pattern for pattern, name in UNSUPPORTED_VARIANTS if name == variant]
    return sorted(name for name in tensor_names if any(p.search(name) for p in patterns))


def mark_unsupported(entry: LoraEntry, tensor_names: Iterable[str]) -> LoraEntry:
    """`entry` marked with the unsupported variant its weight file's header shows (e.g. after `read_remote_header`)."""
    return dataclasses.replace(entry, unsupported=unsupported_variant(tensor_names))
