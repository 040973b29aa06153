"""`MODELS`: the pools to serve, each a model and the base its LoRAs are checked against.

Parsed strictly by `parse_models` for `engine.settings`, beside it (this module, like settings, never imports
torch, nor the engine's family registry: the served families are the registered identities, `families`).
The deployment's model ids are the identities' own, named by none of them here: the default model is the first
registered family's reference model; the offline demo's pools (`DEMO_POOLS`) and those a large GPU serves with
nothing configured (`DEFAULT_POOLS`) are the families that declare themselves so (`FamilyIdentity.demo`,
`default_pool`), in the registry's order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from engine.errors import SettingsError
from families import IDENTITIES, TINY_MODEL_IDS, labels
from lora_catalog.bases import family_of_base
from lora_catalog.entries import Family

__all__ = [
    "DEFAULT_MODEL_ID",
    "DEFAULT_POOLS",
    "DEMO_LATER_POOLS",
    "DEMO_POOLS",
    "HUB_ID",
    "TINY_MODEL_ID",
    "TINY_MODEL_IDS",
    "PoolSetting",
    "Quantize",
    "parse_models",
]

_DEMO = tuple(i for i in IDENTITIES.values() if i.demo)
DEFAULT_MODEL_ID = next(iter(IDENTITIES.values())).model_id
# The default family's tiny pipeline (the first registered one).
TINY_MODEL_ID = next(iter(TINY_MODEL_IDS))
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
# QUANTIZE's values (engine.settings), which a MODELS item may also name for its own pool.
Quantize = Literal["off", "fp8", "int4", "auto"]
_MODELS_FORM = (
    "a comma-separated list of MODEL or MODEL=BASE, each optionally followed by :off, :fp8, :int4 or :auto (that "
    f"pool's QUANTIZE), where MODEL is a Hub repo id, a local diffusers folder or {' / '.join(TINY_MODEL_IDS)}, "
    f"and BASE the {labels()} base repo id its LoRAs are checked against (needed for a local folder); "
    "MODEL[=BASE]@GGUF serves the denoiser from a GGUF file (below); e.g. "
    f"{_DEMO[-1].model_id}:fp8,{DEFAULT_MODEL_ID}"
)
# A pool whose denoiser is a GGUF file (engine.weights.gguf): `MODEL[=BASE]@GGUF`, GGUF a Hub file or a local one.
_GGUF_FORM = (
    "MODEL[=BASE]@GGUF with no :QUANTIZE suffix (the file fixes the storage), where GGUF is a Hub file "
    "OWNER/REPO/PATH.gguf or an absolute path /PATH.gguf under GGUF_DIR, e.g. "
    "black-forest-labs/FLUX.1-dev@city96/FLUX.1-dev-gguf/flux1-dev-Q4_K_S.gguf; a two-transformer base (Wan 2.2 "
    "A14B) names both files, MODEL[=BASE]@GGUF@GGUF_2: its high-noise transformer's, then its low-noise "
    "transformer_2's"
)


@dataclass(frozen=True)
class PoolSetting:
    """One pool of `MODELS`: what to load, and the base its LoRAs are checked against."""

    model_id: str
    base_model_id: str
    # This pool's QUANTIZE (`MODEL:fp8`); None: the QUANTIZE setting's.
    quantize: Quantize | None = None
    # Its denoiser's GGUF file (`MODEL@GGUF`: a Hub file `owner/repo/path.gguf` or an absolute local path); None:
    # the denoiser of MODEL.
    gguf: str | None = None
    # A two-transformer base's second GGUF file (`MODEL@GGUF@GGUF_2`: Wan 2.2 A14B's low-noise `transformer_2`).
    gguf_2: str | None = None

    @property
    def is_tiny(self) -> bool:
        return self.model_id in TINY_MODEL_IDS


# The offline demo's pools: each demo family's tiny pipeline, checked against its reference model.
DEMO_POOLS = tuple(PoolSetting(i.tiny_id, i.model_id) for i in _DEMO if i.tiny_id)
# The pools it loads in the background once its page is up (`FamilyIdentity.demo_later`: a video pool, a
# reference-editing one and a quantized one), each in its own QUANTIZE.
DEMO_LATER_POOLS = tuple(
    PoolSetting(i.tiny_id, i.model_id, cast(Quantize, i.demo_later))
    for i in IDENTITIES.values()
    if i.demo_later is not None and i.tiny_id
)
# What a GPU of 20 GB or more serves with nothing configured: each default-pool family's reference model.
DEFAULT_POOLS = tuple(PoolSetting(i.model_id, i.model_id) for i in IDENTITIES.values() if i.default_pool)


def parse_models(raw: str) -> tuple[PoolSetting, ...]:
    """Parse `MODELS`; SettingsError names the bad item and the accepted form."""
    items = [item.strip() for item in raw.split(",")]
    if not any(items):
        raise SettingsError(f"MODELS={raw!r} names no model; accepted: {_MODELS_FORM}")
    pools: list[PoolSetting] = []
    for item in items:
        if not item:
            raise SettingsError(f"MODELS={raw!r} has an empty item; accepted: {_MODELS_FORM}")
        item, quantize = _quantize_suffix(item)
        item, gguf, gguf_2 = _gguf_source(item, quantize)
        model, sep, base = (part.strip() for part in item.partition("="))
        if not model or (sep and not base) or "=" in base:
            raise SettingsError(f"MODELS item {item!r} is malformed; accepted: {_MODELS_FORM}")
        if not sep:
            base = _default_base(model, item)
        if not HUB_ID.match(base):
            raise SettingsError(f"MODELS item {item!r}: BASE {base!r} is not a Hub repo id; accepted: {_MODELS_FORM}")
        family = family_of_base(base)
        if family not in IDENTITIES:
            what = "not a base we know" if family is Family.UNKNOWN else f"of the {family} family, not served here"
            raise SettingsError(
                f"MODELS item {item!r}: base {base!r} is {what}; accepted: {_MODELS_FORM} "
                "(a fine-tune names the base it was trained from as BASE)"
            )
        if any(p.model_id == model for p in pools):
            raise SettingsError(f"MODELS={raw!r} lists {model!r} twice; accepted: each model once")
        pools.append(PoolSetting(model, base, quantize, gguf, gguf_2))
    return tuple(pools)


def _quantize_suffix(item: str) -> tuple[str, Quantize | None]:
    """`MODEL[=BASE]:fp8` as the item without its suffix and the pool's QUANTIZE (a Hub id holds no colon)."""
    rest, colon, suffix = item.rpartition(":")
    if not colon:
        return item, None
    for choice in get_args(Quantize):
        if suffix.strip().lower() == choice:
            return rest.strip(), choice
    accepted = ", ".join(get_args(Quantize))
    raise SettingsError(f"MODELS item {item!r}: QUANTIZE {suffix.strip()!r} is not accepted; accepted: {accepted}")


def _gguf_source(item: str, quantize: Quantize | None) -> tuple[str, str | None, str | None]:
    """`MODEL[=BASE]@GGUF[@GGUF_2]` as the item without its GGUF files and the GGUF sources (None: no `@`; no
    second), checked for their form only (engine.weights.gguf finds the files and refuses a local path outside
    GGUF_DIR; loading refuses a second file for a base with one transformer, and one file for a base with two)."""
    rest, at, sources = (part.strip() for part in item.partition("@"))
    if not at:
        return item, None, None
    first, second, *more = [part.strip() for part in sources.split("@")] + [None]
    for source in (first, second):
        if source is None:
            continue
        hub = source.split("/")
        is_hub = len(hub) >= 3 and HUB_ID.match("/".join(hub[:2])) is not None and all(hub[2:])
        if quantize is not None or more[:-1] or not source.endswith(".gguf") or not (is_hub or source[:1] == "/"):
            raise SettingsError(f"MODELS item {item!r}: GGUF {source!r} is not accepted; accepted: {_GGUF_FORM}")
    return rest, first, second


def _default_base(model: str, item: str) -> str:
    if model in TINY_MODEL_IDS:
        return TINY_MODEL_IDS[model]
    if HUB_ID.match(model) and not Path(model).exists():
        return model
    raise SettingsError(f"MODELS item {item!r} is a local folder without a BASE; accepted: {_MODELS_FORM}")
