"""Which adapter variants the engine cannot fuse, told from tensor names alone (no torch, no tensor data).

The catalogue marks such LoRAs "not supported" from a file header, before anyone presses Generate;
the engine refuses the same files with the same variant name. Plain LoRA, LoHa, LoKr, LoCon (with
or without a Tucker core) and DoRA are supported and never match here; so are full differences (`.diff`,
`.diff_b`, `.diff_m`) on a family that applies them (`FamilyIdentity.full_differences`: Wan's).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from families import IDENTITIES, Family

from .entries import LoraEntry

__all__ = [
    "FULL_DIFFERENCES",
    "UNSUPPORTED_VARIANTS",
    "applies_full_differences",
    "mark_unsupported",
    "unsupported_variant",
    "variant_tensors",
]

# The variant name of full differences: ComfyUI's `.diff` (a weight's) and `.diff_b` (a bias'), and the `.diff_m`
# of kijai's and lightx2v's Wan files (a block's modulation).
FULL_DIFFERENCES = "full weight differences"

# (tensor-name pattern, variant name): LyCORIS module names (`lycoris/modules/*.py` weight_list) and PEFT's.
UNSUPPORTED_VARIANTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"\.(oft_blocks|oft_diag)$|\.oft_R(\.weight)?$|\.oft_s$", "OFT"),
        (r"\.boft_[Rs](\.weight)?$", "BOFT"),
        (r"\.on_input$|\.ia3_l(\.weight)?$", "IA3"),
        (r"\.diff(_b|_m)?$", FULL_DIFFERENCES),
        (r"\.(a1|a2|b1|b2|bm)\.weight$", "GLoRA"),
        (r"\.[wb]_norm$", "norm-layer fine-tuning"),
        (r"\.(q_layer|p_layer)\.weight$|\.lambda_layer$", "T-LoRA"),
        (r"\.lokr_t1$", "a LoKr Tucker core on the first factor"),
        (r"(lora_B|lora_up|lora_down|lora_A)\.bias$|\.bias_(indices|values)$", "LoRA bias terms"),
    )
)


def unsupported_variant(tensor_names: Iterable[str], *, full_differences: bool = False) -> str | None:
    """The name of the first unsupported variant the tensor names belong to, or None when all can be fused;
    `full_differences`: the family applies them (they are then no unsupported variant)."""
    for name in tensor_names:
        for pattern, variant in UNSUPPORTED_VARIANTS:
            if pattern.search(name) and not (full_differences and variant == FULL_DIFFERENCES):
                return variant
    return None


def variant_tensors(tensor_names: Iterable[str], variant: str) -> list[str]:
    """The tensor names that belong to `variant` (as `unsupported_variant` named it), sorted: what a refusal names."""
    patterns = [pattern for pattern, name in UNSUPPORTED_VARIANTS if name == variant]
    return sorted(name for name in tensor_names if any(p.search(name) for p in patterns))


def mark_unsupported(entry: LoraEntry, tensor_names: Iterable[str]) -> LoraEntry:
    """`entry` marked with the unsupported variant its weight file's header shows (e.g. after `read_remote_header`),
    for its family (one that applies full differences takes them)."""
    unsupported = unsupported_variant(tensor_names, full_differences=applies_full_differences(entry.family))
    return dataclasses.replace(entry, unsupported=unsupported)


def applies_full_differences(family: Family) -> bool:
    """Whether `family`'s pools apply its LoRAs' full differences (`FamilyIdentity.full_differences`)."""
    identity = IDENTITIES.get(family)
    return identity is not None and identity.full_differences
