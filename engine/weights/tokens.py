"""Pivotal-tuning tokens in and out of the served text encoders, exactly (the policy: `engine.formats.pivotal`).

`TokenPatcher` swaps a fused set's rows in beside `engine.weights.swap.WeightPatcher`, under the same pipeline
lock; `swapped_tokenizers` gives a run the token-aware tokenizers for its duration only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from engine.formats.pivotal import TextEncoders, TokenEmbeddings

__all__ = ["TokenPatcher", "swapped_tokenizers"]

logger = logging.getLogger(__name__)


class TokenPatcher:
    """Swaps token sets' rows into the text encoders' embeddings and out; knows the tokenizers for a run.

    Not thread-safe: `apply` and `restore` run under the engine's pipeline lock, like `WeightPatcher`.
    """

    def __init__(self, encoders: TextEncoders) -> None:
        self._encoders = encoders
        self._active: tuple[TokenEmbeddings, ...] = ()
        self._tokenizers: Mapping[str, Any] = {}

    @property
    def active(self) -> tuple[str, ...]:
        """The tokens put in right now."""
        return tuple(t for e in self._active for t in e.tokens)

    @property
    def tokenizers(self) -> Mapping[str, Any]:
        """Pipeline attribute -> the tokenizer a run of the fused set must use (empty: the base ones)."""
        return self._tokenizers

    def apply(self, embeddings: Iterable[TokenEmbeddings | None]) -> None:
        """Make the text encoders hold exactly these sets' rows (none: the base); on failure leave the base."""
        wanted = tuple(e for e in embeddings if e is not None)
        if len(wanted) == len(self._active) and all(a is b for a, b in zip(wanted, self._active, strict=True)):
            return
        started = time.perf_counter()
        self.restore()
        if not wanted:
            return
        tokens = tuple(t for e in wanted for t in e.tokens)
        try:
            tokenizers = self._encoders.tokenizers_with(tokens)
            for index in range(len(self._encoders.encoders)):
                self._extend(index, [e.rows[index] for e in wanted])
            served = self._encoders.encoders
            self._tokenizers = {attribute: tokenizers[i] for i, (_, attribute, _) in enumerate(served)}
            self._active = wanted
        except BaseException:
            self.restore()
            raise
        elapsed = time.perf_counter() - started
        logger.info("tokens %s put into both text encoders in %.1f ms", "".join(tokens), elapsed * 1000)

    def restore(self) -> None:
        """Put the base embedding weights back (the same tensors, never written)."""
        for module, weight in zip(self._encoders.modules, self._encoders.weights, strict=True):
            if module.weight is not weight:
                module.weight = weight
                module.num_embeddings = weight.shape[0]
        self._tokenizers = {}
        self._active = ()

    @torch.no_grad()
    def _extend(self, index: int, rows: Sequence[torch.Tensor]) -> None:
        base = self._encoders.weights[index]
        new = torch.cat([base.detach(), *(r.to(device=base.device, dtype=base.dtype) for r in rows)])
        module = self._encoders.modules[index]
        module.weight = nn.Parameter(new, requires_grad=base.requires_grad)
        module.num_embeddings = new.shape[0]


@contextmanager
def swapped_tokenizers(pipe: Any, tokenizers: Mapping[str, Any]) -> Iterator[None]:
    """Inside the block the pipeline uses `tokenizers` (attribute -> tokenizer); the ones it had after it."""
    if not tokenizers:
        yield
        return
    before = {attribute: getattr(pipe, attribute) for attribute in tokenizers}
    try:
        for attribute, tokenizer in tokenizers.items():
            setattr(pipe, attribute, tokenizer)
        yield
    finally:
        for attribute, tokenizer in before.items():
            setattr(pipe, attribute, tokenizer)
