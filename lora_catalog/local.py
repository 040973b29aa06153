"""LoRAs from local folders: every `.safetensors` LoRA below a folder becomes an entry.

Only headers are read (no tensor is loaded), so scanning a folder of a
hundred LoRAs takes milliseconds. A file that is not a readable LoRA is
skipped with a log line instead of breaking the catalogue.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from .bases import family_from_keys, family_from_metadata
from .cards import is_non_commercial
from .entries import Family, LoraEntry
from .errors import HeaderError
from .hints import metadata_hints
from .pivotal import (
    embeddings_for,
    is_embeddings_file,
    looks_beyond_own_name,
    own_embeddings_name,
    pivotal_tokens,
    token_count,
    with_token_triggers,
)
from .refs import local_ref
from .sft_header import SafetensorsHeader, read_header
from .variants import applies_full_differences, unsupported_variant

__all__ = [
    "PREVIEW_SUFFIXES",
    "LocalIndex",
    "LocalLora",
    "entry_for_file",
    "header_family",
    "local_embeddings",
    "scan_local_dirs",
]

logger = logging.getLogger(__name__)

PREVIEW_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".webp")
# Tensor-name fragments of LoRA-family adapters (kohya, diffusers/PEFT, LyCORIS); a full checkpoint has none.
_ADAPTER_MARKERS = ("lora", "hada_", "lokr_", ".alpha", "oft_")


@dataclass(frozen=True)
class LocalLora:
    """A local entry and the file it stands for."""

    entry: LoraEntry
    path: Path


@dataclass(frozen=True)
class LocalIndex:
    """Local LoRAs by ref (`local:<relative path>`)."""

    by_ref: Mapping[str, LocalLora]

    @property
    def entries(self) -> tuple[LoraEntry, ...]:
        return tuple(item.entry for item in self.by_ref.values())

    def get(self, ref: str) -> LocalLora | None:
        return self.by_ref.get(ref)


def scan_local_dirs(dirs: Sequence[Path]) -> LocalIndex:
    """Index every LoRA below `dirs` (recursively, in name order); the first folder wins a clash of refs."""
    found: dict[str, LocalLora] = {}
    for root in (Path(d) for d in dirs):
        if not root.is_dir():
            logger.warning("local LoRA folder %s does not exist or is not a folder; skipping it", root)
            continue
        for path in _safetensors_below(root):
            if is_embeddings_file(path.name):
                continue  # loads with its LoRA (lora_catalog.pivotal)
            try:
                entry = entry_for_file(root, path)
            except (HeaderError, OSError) as e:
                logger.warning("skipping local file %s: %s", path, e)
                continue
            if entry is None:
                logger.info("skipping local file %s: its tensors are not a LoRA's", path)
            elif entry.ref in found:
                logger.warning(
                    "skipping local file %s: %s is already taken by %s", path, entry.ref, found[entry.ref].path
                )
            else:
                found[entry.ref] = LocalLora(entry=entry, path=path)
    return LocalIndex(by_ref=MappingProxyType(found))


def entry_for_file(root: Path, path: Path) -> LoraEntry | None:
    """The entry for one file below `root`, None when it is not a LoRA; HeaderError when unreadable."""
    header = read_header(path)
    if not any(marker in name.lower() for name in header.tensors for marker in _ADAPTER_MARKERS):
        return None
    metadata = header.metadata
    family = header_family(header)
    stat = path.stat()
    license_id = _meta(metadata, "modelspec.license")
    trigger = _meta(metadata, "modelspec.trigger_phrase") or _meta(metadata, "instance_prompt")
    triggers: tuple[str, ...] = (trigger,) if trigger else ()
    tags = _meta(metadata, "modelspec.tags")
    embeddings = local_embeddings(path)
    if embeddings is not None:
        triggers = with_token_triggers(triggers, _tokens_of(embeddings))
    return LoraEntry(
        ref=local_ref(PurePosixPath(path.relative_to(root).as_posix())),
        repo_id=None,
        title=_meta(metadata, "modelspec.title") or _meta(metadata, "ss_output_name") or path.stem,
        family=family,
        trigger_words=triggers,
        preview_urls=_previews(path),
        license=license_id,
        non_commercial=is_non_commercial(license_id),
        last_modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
        weight_name=path.name,
        weight_size=stat.st_size,
        tags=tuple(t.strip() for t in tags.split(",") if t.strip()) if tags else (),
        source="local",
        unsupported=unsupported_variant(header.tensors, full_differences=applies_full_differences(family)),
        embeddings_name=embeddings.name if embeddings else None,
        embeddings_size=embeddings.stat().st_size if embeddings else None,
        hints=metadata_hints(metadata, (path.name,)),
    )


def local_embeddings(path: Path) -> Path | None:
    """The pivotal-tuning embeddings file beside local LoRA `path`, by lora_catalog.pivotal's naming rule."""
    if looks_beyond_own_name(path.name):
        siblings = [p.name for p in path.parent.iterdir() if p.is_file()]
    else:
        # One stat, not a folder listing per LoRA: a folder of thousands of LoRAs scans in linear time.
        own = own_embeddings_name(path.name)
        siblings = [own] if path.with_name(own).is_file() else []
    name = embeddings_for(path.name, siblings)
    return path.with_name(name) if name else None


def _tokens_of(path: Path) -> tuple[str, ...]:
    try:
        count = token_count(read_header(path))
    except (HeaderError, OSError) as e:
        # The engine refuses such a file with the reason when the LoRA is used; the entry still lists.
        logger.warning("embeddings file %s is unreadable: %s", path, e)
        return ()
    return pivotal_tokens(count or 0)


def header_family(header: SafetensorsHeader) -> Family:
    """The family a file's header declares or its tensor names suggest."""
    return family_from_metadata(header.metadata) or family_from_keys(header.tensors) or Family.UNKNOWN


def _safetensors_below(root: Path) -> list[Path]:
    paths = []
    for folder, subfolders, files in os.walk(root):
        # Hidden folders hold caches and partial downloads, not LoRAs someone meant to serve.
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        paths += [Path(folder) / f for f in sorted(files) if f.lower().endswith(".safetensors")]
    return paths


def _previews(path: Path) -> tuple[str, ...]:
    for stem in (path.stem, f"{path.stem}.preview"):
        for suffix in PREVIEW_SUFFIXES:
            for candidate in (path.with_name(stem + suffix), path.with_name(stem + suffix.upper())):
                if candidate.is_file():
                    return (str(candidate),)
    return ()


def _meta(metadata: Mapping[str, str], key: str) -> str | None:
    value = metadata.get(key, "").strip()
    return value or None
