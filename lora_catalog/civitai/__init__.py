"""Civitai as a second LoRA source: references users paste, its public REST API, and safe downloads.

Torch-free like the rest of the catalogue. `refs` parses what users paste, `bases` maps Civitai's base-model
labels to pools, `versions` reads the API's answers and applies this Space's policy (LoRAs only, the NSFW
ceiling, early access), `source` asks the API (cached, stale-while-revalidate), `download` fetches a file
from Civitai's own hosts only.
"""

from __future__ import annotations

from .bases import CIVITAI_BASES, CivitaiBase, civitai_base, civitai_base_for
from .refs import CIVITAI_PREFIX, CivitaiRef, is_civitai_ref, parse_civitai

__all__ = [
    "CIVITAI_BASES",
    "CIVITAI_PREFIX",
    "CivitaiBase",
    "CivitaiRef",
    "civitai_base",
    "civitai_base_for",
    "is_civitai_ref",
    "parse_civitai",
]
