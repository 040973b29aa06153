"""The LoRA catalogue: public LoRAs for a base model from the Hub, a snapshot and local folders.

Torch-free on purpose (the UI imports it before any model loads); a test
checks that importing it pulls in neither torch nor diffusers nor transformers.
"""

from __future__ import annotations

from .bases import (
    DEFAULT_BASE,
    KNOWN_BASES,
    KnownBase,
    family_from_keys,
    family_from_metadata,
    family_of_base,
)
from .cards import is_non_commercial
from .catalog import Catalog
from .entries import Family, LoraEntry
from .errors import (
    AmbiguousWeightsError,
    CatalogError,
    GatedLoraError,
    HeaderError,
    HubUnavailableError,
    InvalidRepoIdError,
    InvalidRequestError,
    InvalidWeightNameError,
    LoraNotFoundError,
    NoSafetensorsError,
    PickleOnlyError,
    SnapshotError,
)
from .hub import SORTS, HubSource, Sort
from .listing import CatalogPage, Freshness
from .local import LocalIndex, LocalLora, header_family, scan_local_dirs
from .refs import parse_local_ref, validate_repo_id, validate_revision, validate_weight_name
from .sft_header import SafetensorsHeader, TensorInfo, read_header, read_header_bytes
from .snapshot import SNAPSHOT_FORMAT, Snapshot, read_snapshot, write_snapshot
from .variants import mark_unsupported, unsupported_variant

__all__ = [
    "DEFAULT_BASE",
    "KNOWN_BASES",
    "SNAPSHOT_FORMAT",
    "SORTS",
    "AmbiguousWeightsError",
    "Catalog",
    "CatalogError",
    "CatalogPage",
    "Family",
    "Freshness",
    "GatedLoraError",
    "HeaderError",
    "HubSource",
    "HubUnavailableError",
    "InvalidRepoIdError",
    "InvalidRequestError",
    "InvalidWeightNameError",
    "KnownBase",
    "LocalIndex",
    "LocalLora",
    "LoraEntry",
    "LoraNotFoundError",
    "NoSafetensorsError",
    "PickleOnlyError",
    "SafetensorsHeader",
    "Snapshot",
    "SnapshotError",
    "Sort",
    "TensorInfo",
    "family_from_keys",
    "family_from_metadata",
    "family_of_base",
    "header_family",
    "is_non_commercial",
    "mark_unsupported",
    "parse_local_ref",
    "read_header",
    "read_header_bytes",
    "read_snapshot",
    "scan_local_dirs",
    "unsupported_variant",
    "validate_repo_id",
    "validate_revision",
    "validate_weight_name",
    "write_snapshot",
]
