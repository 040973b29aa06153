"""A pool whose denoiser is a GGUF file (`MODELS` item `MODEL[=BASE]@GGUF`; a two-transformer base, Wan 2.2 A14B:
`MODEL[=BASE]@GGUF@GGUF_2`, the second file its low-noise `transformer_2`'s): each file found and checked, its
transformer read from it by diffusers (`engine.weights.gguf`) and given to the pipeline in place of MODEL's own,
so MODEL's own weights of it are never read (a tiny pipeline, built in memory, has its replaced)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch

from engine.errors import SettingsError
from engine.families.registry import FamilySpec
from engine.families.tiny import build_tiny
from engine.settings import Settings
from engine.weights.gguf import branch_gguf_denoiser, check_gguf_file, load_gguf_denoiser, resolve_gguf_source
from engine.weights.int4 import in_storage_or_int4, quantize_denoiser_int4
from engine.weights.quantized import quantize_denoiser

__all__ = ["gguf_components", "gguf_denoiser", "stored", "tiny_with_gguf"]

logger = logging.getLogger(__name__)

_FORMS = {
    1: "MODEL[=BASE]@GGUF, one file for its one transformer",
    2: "MODEL[=BASE]@GGUF@GGUF_2: the high-noise transformer's file, then the low-noise transformer_2's",
}


def gguf_components(settings: Settings, family: FamilySpec) -> dict[str, str]:
    """The pool's stored components (`FamilySpec.stored`) with their GGUF files, in order; SettingsError where
    the MODELS item names another number of files than the base has transformers."""
    sources = [s for s in (settings.gguf, settings.gguf_2) if s is not None]
    if len(sources) != len(family.stored):
        raise SettingsError(
            f"MODELS item for {settings.model_id!r} names {len(sources)} GGUF file(s), but base "
            f"{settings.base_model_id!r} has {len(family.stored)} transformer(s) ({', '.join(family.stored)}); "
            f"accepted: {_FORMS[len(family.stored)]}"
        )
    return dict(zip(family.stored, sources, strict=True))


def gguf_denoiser(
    settings: Settings, family: FamilySpec, dtype: torch.dtype, config: str | Any = None, component: str = ""
) -> Any:
    """The pool's `component` (default: its denoiser) from its GGUF file (`gguf_components`), computing in
    `dtype`, with the config of `config` (default: MODEL's own, a Hub id or a local folder); SettingsError for a
    file refused."""
    component = component or family.denoiser
    source = gguf_components(settings, family)[component]
    path = resolve_gguf_source(source, settings.gguf_dir, settings.hf_token)
    types = check_gguf_file(path)
    logger.info("pool %s: %s from GGUF %s (tensor types %s)", settings.base_model_id, component, path.name, dict(types))
    (model_class, *_) = cast(Any, family.pipeline_class)._get_signature_types()[component]
    origin = settings.model_id if config is None else config
    return load_gguf_denoiser(path, model_class, origin, component, dtype)


def stored(
    pipe: Any, family: FamilySpec, dtype: torch.dtype, storage: str, settings: Settings
) -> tuple[Any, torch.dtype | None]:
    """The pipeline with every stored component (`FamilySpec.stored`) in `storage`: native, fp8 or int4 as
    `engine.weights.int4.in_storage_or_int4` makes them (the pipeline cast once, first); `gguf`: each read from
    its file in `dtype` already, its linears given branches (those the family keeps in its dtype widened). The
    cast still to make as it is placed (None: none)."""
    rank, keep = settings.lora_max_rank, family.keep_dtype_linears
    if storage == "gguf":
        for component in family.stored:
            branch_gguf_denoiser(getattr(pipe, component), rank=rank, dtype=dtype, keep=keep)
        return pipe, None
    first, *rest = family.stored
    pipe, cast_to = in_storage_or_int4(pipe, first, dtype, storage, rank, keep, settings.int4_group_size)
    if storage == "native":
        return pipe, cast_to
    # The pipeline is in `dtype` now: the rest quantized in place (a cast would widen the stored weights again).
    quantize: Callable[..., object] = (
        quantize_denoiser if storage == "fp8" else partial(quantize_denoiser_int4, group_size=settings.int4_group_size)
    )
    for component in rest:
        quantize(getattr(pipe, component), rank=rank, dtype=dtype, keep=keep)
    return pipe, None


def tiny_with_gguf(settings: Settings, family: FamilySpec, dtype: torch.dtype) -> Any:
    """The tiny pipeline, cast to `dtype`, its stored components replaced by the GGUF files' (each with its config
    the tiny one's)."""
    pipe: Any = build_tiny(settings.model_id, seed=0)
    pipe = pipe.to(dtype=dtype)
    replaced = {
        c: gguf_denoiser(settings, family, dtype, config=getattr(pipe, c), component=c)
        for c in gguf_components(settings, family)
    }
    pipe.register_modules(**replaced)
    return pipe
