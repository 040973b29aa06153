"""Pivotal-tuning embeddings files: which file goes with a LoRA, and the tokens it defines.

diffusers' advanced DreamBooth scripts publish, next to the LoRA, one safetensors file with a row per new token
(`<s0>`, `<s1>`, ...) for each text encoder (`clip_l`, `clip_g`). For `<stem>.safetensors` the accepted files
are `<stem>_emb.safetensors`, or for `pytorch_lora_weights.safetensors` `embeddings.safetensors` or the only
`*_emb.safetensors` beside it; several candidates and no name match means none (a guess could pair a LoRA with
another's tokens). Sources: docs/internals.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .sft_header import SafetensorsHeader

__all__ = [
    "EMBEDDING_TENSORS",
    "LEGACY_EMBEDDINGS_NAME",
    "MAX_TOKENS",
    "TOKEN_PATTERN",
    "embeddings_for",
    "is_embeddings_file",
    "looks_beyond_own_name",
    "own_embeddings_name",
    "pivotal_tokens",
    "token_count",
    "token_runs",
    "with_token_triggers",
]

EMBEDDINGS_SUFFIX = "_emb.safetensors"
LEGACY_EMBEDDINGS_NAME = "embeddings.safetensors"
_SCRIPT_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
# Tensor per text encoder, as the script's `save_embeddings` writes them.
EMBEDDING_TENSORS = ("clip_l", "clip_g")
# CLIP reads 77 positions, two of them start and end: no prompt can use more new tokens than this.
MAX_TOKENS = 75
TOKEN_PATTERN = re.compile(r"<s\d+>")
_TOKEN_RUN = re.compile(r"(?:<s\d+>)+")


def is_embeddings_file(name: str) -> bool:
    """Whether a file name is one a pivotal-tuning embeddings file goes by (never a LoRA to load)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base == LEGACY_EMBEDDINGS_NAME or base.endswith(EMBEDDINGS_SUFFIX)


def embeddings_for(weight_name: str | None, filenames: Iterable[str]) -> str | None:
    """The embeddings file that goes with LoRA `weight_name` among `filenames` (paths in one repo or folder)."""
    if not weight_name or not weight_name.lower().endswith(".safetensors"):
        return None
    folder, _, base = weight_name.rpartition("/")
    prefix = f"{folder}/" if folder else ""
    beside = {f[len(prefix) :]: f for f in filenames if f.startswith(prefix) and "/" not in f[len(prefix) :]}
    own = own_embeddings_name(base)
    if own in beside:
        return beside[own]
    if not looks_beyond_own_name(base):
        return None
    if LEGACY_EMBEDDINGS_NAME in beside:
        return beside[LEGACY_EMBEDDINGS_NAME]
    named = [f for name, f in beside.items() if name.endswith(EMBEDDINGS_SUFFIX)]
    return named[0] if len(named) == 1 else None


def own_embeddings_name(weight_name: str) -> str:
    """`<stem>_emb.safetensors` for LoRA `<stem>.safetensors` (rule 1)."""
    return weight_name[: -len(".safetensors")] + EMBEDDINGS_SUFFIX


def looks_beyond_own_name(weight_name: str) -> bool:
    """Whether rule 2 applies: the LoRA has the scripts' name, so other embeddings names are taken too."""
    return weight_name.rsplit("/", 1)[-1] == _SCRIPT_WEIGHT_NAME


def pivotal_tokens(count: int) -> tuple[str, ...]:
    """The tokens of an embeddings file with `count` rows, in row order."""
    return tuple(f"<s{i}>" for i in range(count))


def token_count(header: SafetensorsHeader) -> int | None:
    """Rows of a well-formed embeddings file (its tensors 2-D, same row count), else None.

    SDXL's scripts write `clip_l` and `clip_g`; SD 1.5's advanced script writes `clip_l` alone (its one
    text encoder). Which tensors a pipeline needs is the engine's check (`engine.formats.pivotal`).
    """
    shapes = [header.tensors[name].shape for name in EMBEDDING_TENSORS if name in header.tensors]
    if not shapes or any(len(shape) != 2 for shape in shapes) or len({shape[0] for shape in shapes}) != 1:
        return None
    count = shapes[0][0]
    return count if 0 < count <= MAX_TOKENS else None


def token_runs(*texts: str) -> tuple[str, ...]:
    """Runs of adjacent `<sN>` tokens in `texts` (e.g. `<s0><s1>`), first seen first, each once."""
    return tuple(dict.fromkeys(run for text in texts for run in _TOKEN_RUN.findall(text)))


def with_token_triggers(words: tuple[str, ...], tokens: tuple[str, ...], *texts: str) -> tuple[str, ...]:
    """Trigger words of a pivotal-tuning LoRA, led by a phrase that holds its tokens.

    The UI inserts the first trigger word. A card's instance prompt (`a photo of <s0><s1>`)
    already holds the tokens and stays first; otherwise the token runs the card's other
    texts use come first, and failing those, all the file's tokens in order.
    """
    if words and TOKEN_PATTERN.search(words[0]):
        return words
    runs = token_runs(*words, *texts) or (("".join(tokens),) if tokens else ())
    return tuple(dict.fromkeys((*runs, *words)))
