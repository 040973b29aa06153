"""A pool whose denoiser is a GGUF file (`MODELS` item `MODEL[=BASE]@GGUF`): the file found and checked, the
denoiser read from it by diffusers (`engine.weights.gguf`) and given to the pipeline in place of MODEL's own, so
MODEL's own denoiser weights are never read (a tiny pipeline, built in memory, has its replaced)."""

from __future__ import annotations

import logging
from typing import Any, cast

import torch

from engine.families.registry import FamilySpec
from engine.families.tiny import build_tiny
from engine.settings import Settings
from engine.weights.gguf import branch_gguf_denoiser, check_gguf_file, load_gguf_denoiser, resolve_gguf_source
from engine.weights.quantized import in_storage

__all__ = ["gguf_denoiser", "stored", "tiny_with_gguf"]

logger = logging.getLogger(__name__)


def gguf_denoiser(settings: Settings, family: FamilySpec, dtype: torch.dtype, config: str | Any = None) -> Any:
    """The pool's denoiser from its GGUF file (`settings.gguf`), computing in `dtype`, with the config of
    `config` (default: MODEL's own, a Hub id or a local folder); SettingsError for a file refused."""
    assert settings.gguf is not None
    path = resolve_gguf_source(settings.gguf, settings.gguf_dir, settings.hf_token)
    types = check_gguf_file(path)
    logger.info("pool %s: denoiser from GGUF %s (tensor types %s)", settings.base_model_id, path.name, dict(types))
    (model_class, *_) = cast(Any, family.pipeline_class)._get_signature_types()[family.denoiser]
    source = settings.model_id if config is None else config
    return load_gguf_denoiser(path, model_class, source, family.denoiser, dtype)


def stored(
    pipe: Any, family: FamilySpec, dtype: torch.dtype, storage: str, rank: int
) -> tuple[Any, torch.dtype | None]:
    """`engine.weights.quantized.in_storage`, and `gguf`: the denoiser read from its file in `dtype` already, its
    linears given branches of `rank` (those the family keeps in its dtype widened), nothing left to cast."""
    if storage != "gguf":
        return in_storage(pipe, family.denoiser, dtype, storage, rank, family.keep_dtype_linears)
    branch_gguf_denoiser(getattr(pipe, family.denoiser), rank=rank, dtype=dtype, keep=family.keep_dtype_linears)
    return pipe, None


def tiny_with_gguf(settings: Settings, family: FamilySpec, dtype: torch.dtype) -> Any:
    """The tiny pipeline, cast to `dtype`, its denoiser replaced by the GGUF file's (its config the tiny one's)."""
    pipe: Any = build_tiny(settings.model_id, seed=0)
    pipe = pipe.to(dtype=dtype)
    denoiser = gguf_denoiser(settings, family, dtype, config=getattr(pipe, family.denoiser))
    pipe.register_modules(**{family.denoiser: denoiser})
    return pipe
