"""From a LoRA reference to a checked file on disk: Hub repos through huggingface_hub, local files, or Civitai.

Resolution asks the catalogue (which caches Hub metadata, so a LoRA used again
costs no Hub call), refuses over-size files from metadata before downloading,
and downloads into the Hub cache, whose partial downloads are never used.
A pivotal-tuning embeddings file beside the LoRA (named by the rule in
`lora_catalog.pivotal`, in a Hub repo or a local folder) is located, size-checked
and downloaded the same way. Civitai LoRAs (`civitai:<version>`) take `engine.prepare.civitai`'s way: its API
(cached by the catalogue's source), the size limit from its metadata, then a download kept only when its SHA256
matched.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import httpx2
from huggingface_hub import constants as hf_constants
from huggingface_hub import (
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name

from engine.errors import (
    AdapterLoadError,
    GatedLoraError,
    HubUnavailableError,
    LimitExceededError,
    LoraNotFoundError,
    StorageError,
    SwitchboardError,
)
from engine.families.origin import declared_bases_from_tags
from engine.prepare.civitai import CivitaiFiles
from engine.prepare.keys import adapter_key
from engine.prepare.local_files import locate_local
from engine.prepare.source import AdapterSource
from engine.requests import LOCAL_PREFIX, LoraSpec
from lora_catalog.cards import choose_weight
from lora_catalog.civitai.refs import is_civitai_ref
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import CivitaiUnavailableError, HeaderError
from lora_catalog.pairs import split_pair
from lora_catalog.pivotal import embeddings_for
from lora_catalog.sft_header import SafetensorsHeader, read_header

__all__ = ["AdapterResolver", "AdapterSource", "HubResolver"]

logger = logging.getLogger(__name__)


class HubResolver(Protocol):
    def resolve(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> LoraEntry: ...

    def stale_warning(self, ref: str, revision: str | None = None, weight_name: str | None = None) -> str | None: ...


class AdapterResolver:
    def __init__(
        self,
        hub: HubResolver | None,
        *,
        local_dir: Path | None,
        token: str | None,
        max_bytes: int,
        cache_dir: Path | None = None,
        timeout_s: float = 10.0,
        civitai: CivitaiFiles | None = None,
    ) -> None:
        self._hub = hub
        self._civitai = civitai
        self._local_dir = local_dir
        self._token = token
        self._max_bytes = max_bytes
        self._cache_dir = cache_dir
        self._timeout_s = timeout_s

    @property
    def uses_hub(self) -> bool:
        return self._hub is not None

    @property
    def cache_dir(self) -> Path | None:
        """The Hub cache LoRAs are downloaded into (None: huggingface_hub's default)."""
        return self._cache_dir

    @property
    def civitai_dir(self) -> Path | None:
        """The folder Civitai LoRAs are downloaded into (None: no Civitai access)."""
        return self._civitai.folder if self._civitai is not None else None

    def locate(self, spec: LoraSpec) -> AdapterSource:
        """Identify the file a normalised spec names (a Hub metadata call unless the catalogue has it cached)."""
        # The spec was parsed and validated once, by `normalise_request`; only its kind is read here.
        if spec.ref.startswith(LOCAL_PREFIX):
            source = locate_local(self._local_dir, spec.ref.removeprefix(LOCAL_PREFIX))
        elif is_civitai_ref(spec.ref):
            source = self._locate_civitai(spec.ref)
        else:
            source = self._locate_hub(spec, spec.ref)
        self._check_size(source.ref, source.key.weight_name, source.size)
        if source.embeddings_name is not None:
            self._check_size(source.ref, source.embeddings_name, source.embeddings_size)
        return source

    def measure(self, source: AdapterSource) -> AdapterSource:
        """`source` with the sizes its Hub metadata lacked asked for (HEAD), and checked: a pair's two files together,
        against MAX_ADAPTER_BYTES, before anything is downloaded. These are the sizes the load gate holds. A size
        only a download tells (a Civitai file its API gave none for) is checked once fetched (`fetched_bytes`)."""
        if source.local_path is not None or source.civitai is not None:
            return source
        size, embeddings = source.size, source.embeddings_size
        with _hub_errors(source.ref, source.key.revision, source.key.weight_name):
            if size is None:
                sizes = [self._remote_size(source, name) for name in source.halves or (source.key.weight_name,)]
                self._check_size(source.ref, source.key.weight_name, sum(s or 0 for s in sizes))
                size = None if None in sizes else sum(s or 0 for s in sizes)
            if embeddings is None and source.embeddings_name is not None:
                embeddings = self._remote_size(source, source.embeddings_name)
                self._check_size(source.ref, source.embeddings_name, embeddings)
        return dataclasses.replace(source, size=size, embeddings_size=embeddings)

    def fetched_bytes(self, source: AdapterSource, files: tuple[Path, Path | None], embeddings: Path | None) -> int:
        """The fetched files' bytes on disk, checked as before the download (a pair's two together): what the load
        gate holds for the parse, whether or not their sizes were known before."""
        size = sum(path.stat().st_size for path in files if path is not None)
        self._check_size(source.ref, source.key.weight_name, size)
        extra = embeddings.stat().st_size if embeddings is not None else 0
        self._check_size(source.ref, source.embeddings_name or "", extra)
        return size + extra

    def fetch(self, source: AdapterSource) -> Path:
        """The adapter file on local disk, downloading it into the Hub cache when needed."""
        if source.local_path is not None:
            return source.local_path
        if source.civitai is not None and self._civitai is not None:
            return self._civitai.fetch(source.key, source.civitai)
        return self._download(source, (source.halves or (source.key.weight_name,))[0], source.size is not None)

    def fetch_pair(self, source: AdapterSource) -> Path | None:
        """A pair's second file on local disk (None: one file), from where its first came."""
        if source.civitai is not None and self._civitai is not None and source.civitai.resolved.pair is not None:
            return self._civitai.fetch(source.key, source.civitai, source.civitai.resolved.pair)
        if source.halves is not None:
            return self._download(source, source.halves[1], source.size is not None)
        return source.pair_path

    def fetch_embeddings(self, source: AdapterSource) -> Path | None:
        """The LoRA's pivotal-tuning embeddings file on local disk (downloaded like the LoRA), if it has one."""
        if source.embeddings_name is None:
            return None
        if source.embeddings_path is not None:
            return source.embeddings_path
        return self._download(source, source.embeddings_name, source.embeddings_size is not None)

    def _download(self, source: AdapterSource, filename: str, checked: bool) -> Path:
        """`filename` of the source's repo, into the Hub cache; its size asked for and checked first unless it was
        (`checked`: by the Hub's metadata, or `measure`)."""
        key = source.key
        with _hub_errors(source.ref, key.revision, filename):
            if not checked:
                self._check_size(source.ref, filename, self._remote_size(source, filename))
            path = hf_hub_download(
                key.name,
                filename,
                revision=key.revision,
                token=self._token,
                cache_dir=self._cache_dir,
                etag_timeout=self._timeout_s,
            )
        return Path(path)

    def _remote_size(self, source: AdapterSource, filename: str) -> int | None:
        url = hf_hub_url(source.key.name, filename, revision=source.key.revision)
        return get_hf_file_metadata(url, token=self._token, timeout=self._timeout_s).size

    def header(self, source: AdapterSource, path: Path) -> SafetensorsHeader:
        """The fetched file's safetensors header, read strictly (see `lora_catalog.sft_header` for why ours)."""
        try:
            return read_header(path, label=source.key.weight_name)
        except HeaderError as e:
            raise AdapterLoadError(f"LoRA {source.ref!r} is not a valid safetensors file: {e}") from e

    def _check_size(self, ref: str, weight_name: str, size: int | None) -> None:
        if size is not None and size > self._max_bytes:
            raise LimitExceededError(
                f"LoRA {ref!r} ({weight_name}) is {_mib(size)}; accepted: files up to {_mib(self._max_bytes)}"
            )

    def _locate_hub(self, spec: LoraSpec, repo_id: str) -> AdapterSource:
        if self._hub is None:
            raise HubUnavailableError(f"LoRA {spec.ref!r} is on the Hub, but this Space runs without Hub access")
        # The catalogue's errors are the engine's too (one tree): they pass through as they are.
        try:
            entry = self._hub.resolve(repo_id, spec.revision, spec.weight_name)
        except HubUnavailableError as e:
            on_disk = self._locate_on_disk(spec, repo_id, e)
            if on_disk is None:
                raise
            return on_disk
        if not entry.weight_name or not entry.sha:
            raise AdapterLoadError(f"LoRA {spec.ref!r} has no .safetensors weight file to load")
        bases = tuple(dict.fromkeys((*entry.base_models, *declared_bases_from_tags(entry.tags))))
        key = adapter_key(repo_id, entry.sha, entry.weight_name)
        stale = self._hub.stale_warning(repo_id, spec.revision, spec.weight_name)
        return AdapterSource(
            key,
            repo_id,
            entry.weight_size,
            bases,
            warnings=(stale,) if stale else (),
            embeddings_name=entry.embeddings_name,
            embeddings_size=entry.embeddings_size,
            hints=entry.hints,
            halves=split_pair(entry.weight_name),
        )

    def _locate_civitai(self, ref: str) -> AdapterSource:
        if self._civitai is None:
            raise CivitaiUnavailableError(f"LoRA {ref!r} is on Civitai, but this Space runs without Civitai access")
        key, location, stale = self._civitai.locate(ref)
        files = (location.resolved.file, location.resolved.pair)
        sizes = [f.size for f in files if f is not None]
        # What is known already counts: a pair's other file, its size unknown, is checked once fetched.
        self._check_size(ref, key.weight_name, sum(s or 0 for s in sizes))
        return AdapterSource(
            key,
            ref,
            None if None in sizes else sum(s or 0 for s in sizes),
            location.declared_bases,
            warnings=(stale,) if stale else (),
            declared_family=location.family,
            hints=location.resolved.version.hints,
            finetune=location.finetune,
            civitai=location,
        )

    def _locate_on_disk(self, spec: LoraSpec, repo_id: str, error: HubUnavailableError) -> AdapterSource | None:
        """A Hub LoRA downloaded before, found in the Hub cache with no Hub call (the Hub is down or offline)."""
        folder = self._snapshot_on_disk(repo_id, spec.revision)
        if folder is None:
            return None
        present = tuple(sorted(p.name for p in folder.glob("*.safetensors") if p.is_file()))
        try:
            # The catalogue's own rule, on the files that are on disk.
            chosen = choose_weight(f"{repo_id!r} (on disk)", present, spec.weight_name)
        except SwitchboardError:
            return None
        path = folder / chosen
        key = adapter_key(repo_id, folder.name, chosen)
        warning = (
            f"LoRA {spec.ref!r} is served from the local Hub cache at revision {folder.name[:10]} without its Hub "
            f"metadata: {error}"
        )
        logger.warning("%s", warning)
        # Downloaded with its LoRA, an embeddings file is in the same snapshot (the same rule picks it).
        embeddings = embeddings_for(chosen, present)
        return AdapterSource(
            key,
            repo_id,
            path.stat().st_size,
            (),
            local_path=path,
            warnings=(warning,),
            embeddings_name=embeddings,
            embeddings_size=(folder / embeddings).stat().st_size if embeddings else None,
            embeddings_path=folder / embeddings if embeddings else None,
        )

    def _snapshot_on_disk(self, repo_id: str, revision: str | None) -> Path | None:
        try:
            # local_files_only: huggingface_hub resolves a branch through the cache's refs/ and never
            # touches the network; it raises when that revision was never downloaded.
            return Path(
                snapshot_download(
                    repo_id,
                    revision=revision,
                    cache_dir=self._cache_dir,
                    local_files_only=True,
                    allow_patterns=["*.safetensors"],
                )
            )
        except (LocalEntryNotFoundError, OSError, ValueError):
            pass
        if revision is not None:
            return None
        # LoRAs are downloaded by commit sha (the one the metadata named), which writes no refs/main:
        # the default branch is then the snapshot downloaded last.
        root = Path(self._cache_dir or hf_constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
        snapshots = [p for p in (root / "snapshots").glob("*") if p.is_dir()] if root.is_dir() else []
        return max(snapshots, key=lambda p: p.stat().st_mtime, default=None)


def _mib(size: int) -> str:
    return f"{size / 2**20:.2f} MiB"


@contextmanager
def _hub_errors(ref: str, revision: str, filename: str) -> Iterator[None]:
    """The Hub's and the disk's failures while asking for or downloading `filename`, as the tree's errors."""
    try:
        yield
    except (httpx2.TransportError, LocalEntryNotFoundError) as e:
        # Before EntryNotFoundError, its base: huggingface_hub says "not in the local cache" when the Hub
        # could not be reached (refused, timed out, HTTP 5xx), not that the repo lacks the file.
        raise HubUnavailableError(f"the Hub could not be reached to download LoRA {ref!r}: {e}") from e
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise _hub_lookup_error(e, ref, revision, filename) from e
    except HfHubHTTPError as e:
        raise HubUnavailableError(f"the Hub failed while serving LoRA {ref!r}: {e}") from e
    except OSError as e:
        raise _storage_error(e, ref) from e


def _hub_lookup_error(error: Exception, ref: str, revision: str, filename: str) -> SwitchboardError:
    if isinstance(error, GatedRepoError):
        return GatedLoraError(f"LoRA {ref!r} is gated; accepted: public, non-gated repos")
    if isinstance(error, RevisionNotFoundError):
        return LoraNotFoundError(f"LoRA {ref!r} has no revision {revision!r}")
    if isinstance(error, EntryNotFoundError):
        return LoraNotFoundError(f"LoRA {ref!r} has no file {filename!r} at {revision[:10]}")
    return LoraNotFoundError(f"LoRA {ref!r} was not found on the Hub")


def _storage_error(error: OSError, ref: str) -> StorageError:
    reason = {errno.ENOSPC: "the disk is full", errno.EACCES: "it is not writable", errno.EROFS: "it is read-only"}
    why = reason.get(error.errno or -1, error.strerror or str(error))
    return StorageError(f"LoRA {ref!r} could not be stored in the Hub cache: {why}")
