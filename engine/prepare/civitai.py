"""Civitai LoRAs on the preparation path: located through the catalogue's `CivitaiSource`, fetched into a folder
of their own that the Hub cache's byte budget covers too (`engine.caches.disk`).

The version id is the adapter's identity everywhere (`AdapterKey("civitai", "civitai:<version>", "<version>",
file)`): the host and device caches, routing decisions, ZeroGPU's worker cache, and the folder on disk
(`<folder>/<version>/<file>`). A file is kept there only once its SHA256 matched the API's, so a file found
there is used without asking Civitai for it again (its metadata still comes from the API, cached). Civitai's
base label decides routing (`lora_catalog.civitai.bases`): a mapped label declares its base and family; any
other label declares a family no pool serves (the 404 naming the served bases).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants

from engine.errors import InvalidRequestError, StorageError, SwitchboardError
from engine.formats.adapters import AdapterKey
from engine.prepare.keys import adapter_key
from engine.settings import Settings
from lora_catalog.civitai.bases import civitai_base
from lora_catalog.civitai.refs import parse_civitai
from lora_catalog.civitai.source import CivitaiSource, ResolvedVersion
from lora_catalog.civitai.versions import CivitaiFile, parse_nsfw_level
from lora_catalog.entries import Family
from lora_catalog.pairs import SEPARATOR
from lora_catalog.refs import validate_weight_name

__all__ = ["CivitaiFiles", "CivitaiLocation", "civitai_files"]

logger = logging.getLogger(__name__)

_STORAGE_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EACCES: "it is not writable",
    errno.EROFS: "it is read-only",
}


@dataclass(frozen=True)
class CivitaiLocation:
    """A located Civitai LoRA: the version and file the API described, and what its base label declares."""

    resolved: ResolvedVersion
    # The mapped base repo id (or the label itself when the table maps none) and its family (UNKNOWN when none:
    # no pool serves it).
    declared_bases: tuple[str, ...]
    family: Family
    # Civitai's label when it is a fine-tune of its family's base (Pony, Illustrious, NoobAI).
    finetune: str | None

    @classmethod
    def of(cls, resolved: ResolvedVersion) -> CivitaiLocation:
        label = resolved.version.base_model
        base = civitai_base(label)
        if base is None:
            return cls(resolved, (f"{label or 'an unnamed base'} (Civitai)",), Family.UNKNOWN, None)
        return cls(resolved, (base.base_model_id,), base.family, label if base.finetune else None)


class CivitaiFiles:
    """Civitai's side of `AdapterResolver`: identify a version, then download its file into `folder`."""

    def __init__(self, source: CivitaiSource, folder: Path, *, max_bytes: int) -> None:
        self.source = source
        self.folder = Path(folder)
        self._max_bytes = max_bytes

    def locate(self, ref: str) -> tuple[AdapterKey, CivitaiLocation, str | None]:
        """The adapter's key (its version), what it declares, and a warning when Civitai's metadata is stale."""
        parsed = parse_civitai(ref)
        if parsed is None:
            raise InvalidRequestError(f"{ref!r} is not a Civitai reference")
        resolved = self.source.resolve(parsed)
        file, pair = _stored(resolved.file), resolved.pair and _stored(resolved.pair)
        resolved = dataclasses.replace(resolved, file=file, pair=pair)
        # A pair's weight name is both files' (`lora_catalog.pairs`), high first.
        name = file.name if pair is None else SEPARATOR.join((file.name, pair.name))
        key = adapter_key(resolved.version.ref, str(resolved.version.version_id), name)
        return key, CivitaiLocation.of(resolved), self.source.stale_warning(parsed)

    def fetch(self, key: AdapterKey, location: CivitaiLocation, file: CivitaiFile | None = None) -> Path:
        """The file (or a pair's other `file`) on local disk: the one kept before (its SHA256 was checked then),
        else downloaded now."""
        file = file or location.resolved.file
        path = self.folder / key.revision / file.name
        if path.is_file():
            # Marks it used, for the disk budget's least-recently-used order (atime is unreliable on many mounts).
            now = time.time()
            os.utime(path, (now, now))
            return path
        try:
            return self.source.download(location.resolved, path.parent, max_bytes=self._max_bytes, file=file)
        except SwitchboardError:
            raise  # the tree's own (a restricted download is a PermissionError, hence an OSError, too)
        except OSError as e:
            why = _STORAGE_REASONS.get(e.errno or -1, e.strerror or str(e))
            raise StorageError(f"Civitai LoRA {key.name!r} could not be stored in {self.folder}: {why}") from e


def civitai_files(settings: Settings) -> CivitaiFiles | None:
    """Civitai as `settings` configure it (None when `CIVITAI` is off): its source, shared with the catalogue,
    and the folder its files are kept in (`CIVITAI_CACHE_DIR`, else `$HF_HOME/civitai`)."""
    if not settings.civitai:
        return None
    source = CivitaiSource(
        settings.civitai_endpoint,
        settings.civitai_token,
        settings.hub_timeout_s,
        max_nsfw=parse_nsfw_level(settings.civitai_max_nsfw_level),
        allowed_hosts=settings.civitai_allowed_hosts,
    )
    folder = settings.civitai_cache_dir or Path(hf_constants.HF_HOME) / "civitai"
    return CivitaiFiles(source, folder, max_bytes=settings.max_adapter_bytes)


def _stored(file: CivitaiFile) -> CivitaiFile:
    name = _stored_name(file.name)
    return file if name == file.name else dataclasses.replace(file, name=name)


def _stored_name(name: str) -> str:
    """The file's name as kept on disk: Civitai's when it is a plain `.safetensors` name, else a safe one.

    A name starting with '.' (a hidden file, or one the disk cache would take for a download in progress,
    `.part-…`) is renamed, not refused: the creator chose it, and the user asking for the version cannot change it.
    """
    try:
        checked = validate_weight_name(name)
    except InvalidRequestError:
        checked = None
    plain = checked is not None and "/" not in checked and not checked.startswith(".")
    return checked if plain and checked is not None else "lora.safetensors"
