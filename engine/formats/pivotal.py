"""Pivotal-tuning tokens: put into the tokenizers and text encoders for a request, taken out exactly.

Nothing is added to the served objects and removed again (a tokenizer's vocabulary only grows, and diffusers'
`unload_textual_inversion` has left rows behind, diffusers #6974): each token set gets copies of the base
tokenizers and embedding weights with the rows appended, swapped in only while such a set runs (under the
pipeline lock), and taking them out puts the untouched base tensors back, bit-exact by construction. Two LoRAs
of one request defining the same token are refused (a rewrite would be a guess); a LoRA's scale does not scale
the rows, as in diffusers. The whole argument: docs/internals.md.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from cachetools import LRUCache
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from engine.errors import AdapterLoadError, IncompatibleLoraError, InvalidRequestError
from lora_catalog.errors import HeaderError
from lora_catalog.pivotal import EMBEDDING_TENSORS, MAX_TOKENS, pivotal_tokens, token_count
from lora_catalog.sft_header import read_header

__all__ = ["ENCODERS", "TextEncoders", "TokenEmbeddings", "check_clashes"]

logger = logging.getLogger(__name__)

# (text encoder, its tokenizer, the embeddings file's tensor for it: clip_l, clip_g), as diffusers' script pairs them.
ENCODERS = tuple(zip(("text_encoder", "text_encoder_2"), ("tokenizer", "tokenizer_2"), EMBEDDING_TENSORS, strict=True))
# Tokenizer copies per token set kept; a full-size CLIP tokenizer copy is a few MB and ~0.2 s to make. Every
# script's tokens start at <s0> (two such LoRAs clash), so a set's tokens are <s0>..<sN-1>: few distinct sets.
_DERIVED_CACHE = 4


@dataclass(frozen=True, eq=False)
class TokenEmbeddings:
    """The new tokens of one pivotal-tuning LoRA and their rows, one matrix per served entry of ENCODERS."""

    tokens: tuple[str, ...]
    rows: tuple[torch.Tensor, ...]
    file_name: str

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rows)


def check_clashes(items: Iterable[tuple[str, TokenEmbeddings | None]]) -> None:
    """Refuse a request whose LoRAs (by ref) define the same token twice."""
    owner: dict[str, str] = {}
    for ref, embeddings in items:
        if embeddings is None:
            continue
        clash = [t for t in embeddings.tokens if t in owner]
        if clash:
            raise InvalidRequestError(
                f"LoRAs {owner[clash[0]]!r} and {ref!r} both define the pivotal-tuning tokens {''.join(clash)}, "
                f"so a prompt's {clash[0]} could mean either; accepted: at most one LoRA per token name in a request"
            )
        owner.update((t, ref) for t in embeddings.tokens)


class TextEncoders:
    """The served tokenizers and token-embedding weights of a pipeline, captured once; reads embeddings files.

    `load` and `tokenizers_with` run on preparation threads as well as under the pipeline lock: they read
    only what was captured here, and the tokenizer copies are cached under their own lock.
    """

    def __init__(self, pipe: Any, components: Iterable[str]) -> None:
        # The entries of ENCODERS among the pipeline's adaptable `components` (its family's): both for SDXL,
        # `text_encoder` (clip_l) alone for SD 1.x/2.x and FLUX (whose text_encoder_2, T5, no LoRA adapts).
        wanted = set(components)
        self.encoders = tuple(e for e in ENCODERS if e[0] in wanted)
        self.tokenizers = tuple(getattr(pipe, tokenizer) for _, tokenizer, _ in self.encoders)
        self.modules: tuple[nn.Embedding, ...] = tuple(
            getattr(pipe, encoder).get_input_embeddings() for encoder, _, _ in self.encoders
        )
        self.weights = tuple(m.weight for m in self.modules)
        self._vocab = frozenset(token for t in self.tokenizers for token in t.get_vocab())
        self._lock = threading.Lock()
        self._derived: LRUCache[tuple[str, ...], tuple[Any, ...]] = LRUCache(maxsize=_DERIVED_CACHE)
        self._unfit = next(
            (
                f"the served {encoder} has {w.shape[0]} token rows but its {name} {len(t)} tokens"
                for (encoder, name, _), t, w in zip(self.encoders, self.tokenizers, self.weights, strict=True)
                if len(t) != w.shape[0]
            ),
            None,
        )

    def load(self, path: Path, label: str) -> TokenEmbeddings:
        """Read and check an embeddings file for this pipeline (its header first, then the two tensors)."""
        what = f"{label}'s embeddings file {path.name!r}"
        names = [name for _, _, name in self.encoders]
        accepted = (
            f"accepted: tensors {' and '.join(names)}, one row per token (1 to {MAX_TOKENS}), "
            f"of widths {' and '.join(str(w.shape[1]) for w in self.weights)}"
        )
        try:
            header = read_header(path, label=path.name)
        except HeaderError as e:
            raise AdapterLoadError(f"{what} is not a valid safetensors file: {e}") from e
        shapes = {n: header.tensors[n].shape for n in names if n in header.tensors}
        missing = [n for n in names if n not in shapes]
        if missing:
            raise AdapterLoadError(f"{what} has no tensor {', '.join(missing)}; {accepted}")
        count = token_count(header)
        widths = [tuple(shapes[n][1:]) for n in names]
        if count is None or widths != [(w.shape[1],) for w in self.weights]:
            found = ", ".join(f"{n} of shape {shapes[n]}" for n in names)
            raise IncompatibleLoraError(f"{what} holds {found}; {accepted}")
        if self._unfit is not None:
            raise IncompatibleLoraError(f"{what} cannot be used: {self._unfit}")
        tokens = pivotal_tokens(count)
        taken = [t for t in tokens if t in self._vocab]
        if taken:
            raise IncompatibleLoraError(f"{what} defines {', '.join(taken)}, which the served tokenizers already have")
        try:
            tensors = load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as e:
            raise AdapterLoadError(f"{what} could not be read: {e}") from e
        rows = tuple(tensors[n] for n in names)
        if not all(r.is_floating_point() and bool(torch.isfinite(r).all()) for r in rows):
            raise AdapterLoadError(f"{what} holds NaN, infinite or non-float values; accepted: finite float rows")
        # Made here, off the pipeline's path: the swap then finds the tokenizers cached.
        self.tokenizers_with(tokens)
        return TokenEmbeddings(tokens, rows, path.name)

    def tokenizers_with(self, tokens: tuple[str, ...]) -> tuple[Any, ...]:
        """Copies of the base tokenizers that also know `tokens`, as ids right after their vocabulary."""
        with self._lock:
            cached = self._derived.get(tokens)
            if cached is not None:
                return cached
        started = time.perf_counter()
        made = []
        for (_, name, _), base in zip(self.encoders, self.tokenizers, strict=True):
            # A copy, never the served tokenizer: added tokens cannot be taken out of it again.
            derived = copy.deepcopy(base)
            derived.add_tokens(list(tokens))
            ids = derived.convert_tokens_to_ids(list(tokens))
            if ids != list(range(len(base), len(base) + len(tokens))):
                raise IncompatibleLoraError(f"the served {name} gave tokens {''.join(tokens)} the ids {ids}")
            made.append(derived)
        result = tuple(made)
        with self._lock:
            self._derived[tokens] = result
        logger.info("tokenizers with %s made in %.1f ms", "".join(tokens), (time.perf_counter() - started) * 1000)
        return result
