"""The LoRA disk caches, pruned least recently used first to one byte budget with huggingface_hub's own tools.

After each download a background thread scans the Hub cache (`scan_cache_dir`) and the Civitai folder and,
while their LoRAs take more than the budget, deletes the least recently read first: a Hub revision whole
(`delete_revisions`), a Civitai version's folder whole. A Civitai download's partial file counts against the
budget while it is written and is deleted once stale (unwritten for longer than a live download goes between
writes: `stale_partial_after_s`). Never deleted: the served model's own repos, and
revisions in use (held while resolved, downloaded or read, or leased or fused), under one lock with `hold`
so a revision checked as unused cannot become used before it is gone. Details:
docs/internals.md.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

from engine.formats.adapters import AdapterKey
from lora_catalog.civitai.download import PARTIAL_PREFIX, stale_partial_after_s

__all__ = ["DiskCache", "PruneReport"]

logger = logging.getLogger(__name__)

_Revision = tuple[str, str, str]  # (source, name, revision): ("hub", repo id, commit sha), ("civitai", ref, version)


@dataclass(frozen=True)
class _Candidate:
    """One deletable unit: a Hub revision or a Civitai version's folder."""

    last_read: float
    identity: _Revision
    size: int
    label: str
    folder: Path | None = None  # a Civitai version's folder (None: a Hub revision)


@dataclass(frozen=True)
class PruneReport:
    """One pass: the LoRA bytes on disk before and after, and the revisions deleted ("repo@sha")."""

    before: int
    after: int
    deleted: tuple[str, ...]
    kept_in_use: tuple[str, ...]
    seconds: float


class DiskCache:
    def __init__(
        self,
        budget: int,
        *,
        cache_dir: Path | None = None,
        keep_repos: Iterable[str] = (),
        in_use: Callable[[], set[AdapterKey]] = set,
        civitai_dir: Path | None = None,
        download_timeout_s: float = 10.0,
    ) -> None:
        self.budget = budget
        # A Civitai download's partial file not written for this long is left by a download that is gone.
        self._stale_partial_s = stale_partial_after_s(download_timeout_s)
        self._cache_dir = cache_dir
        self._civitai_dir = civitai_dir
        self._keep_repos = frozenset(keep_repos)
        self._in_use = in_use
        self._lock = threading.Lock()
        self._held: Counter[_Revision] = Counter()
        self._pending = False
        self._worker: threading.Thread | None = None
        self.last_report: PruneReport | None = None

    @contextmanager
    def hold(self, key: AdapterKey) -> Iterator[None]:
        """Keep `key`'s revision on disk inside the block (waits while a deletion runs)."""
        revision = _identity(key)
        with self._lock:
            self._held[revision] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[revision] -= 1
                if self._held[revision] <= 0:
                    del self._held[revision]

    def schedule(self) -> None:
        """Prune in the background, soon: one worker, and a request made while it runs makes it run again."""
        with self._lock:
            self._pending = True
            if self._worker is not None:
                return
            self._worker = threading.Thread(target=self._run, name="hub-cache-prune", daemon=True)
            self._worker.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the background pruning to finish (tests, shutdown); False if it still runs."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
            return not worker.is_alive()
        return True

    def lora_bytes(self) -> int:
        """Bytes the LoRAs take on disk now: Hub repos (the served model's excluded), Civitai files and the
        Civitai downloads in progress."""
        civitai, partial = self._civitai_candidates()
        return sum(r.size_on_disk for r in self._lora_repos()) + sum(c.size for c in civitai) + partial

    def prune(self) -> PruneReport:
        """Delete least recently used LoRA revisions (Hub) and versions (Civitai) until the LoRAs fit the budget."""
        started = time.perf_counter()
        info = None
        try:
            info = scan_cache_dir(self._cache_dir)
        except CacheNotFound:
            pass
        except CorruptedCacheException as e:
            logger.warning("the Hub cache could not be scanned, nothing pruned: %s", e)
            return PruneReport(0, 0, (), (), time.perf_counter() - started)
        repos = [r for r in info.repos if r.repo_type == "model" and r.repo_id not in self._keep_repos] if info else []
        stale = self._delete_stale_partials()
        civitai, partial = self._civitai_candidates()
        total = sum(r.size_on_disk for r in repos) + sum(c.size for c in civitai) + partial
        if total <= self.budget:
            return self._report(total + stale, total, (), (), started)
        # Least recently read first: a revision's last access is its most recently read file's.
        candidates = sorted(
            [
                _Candidate(
                    max((f.blob_last_accessed for f in rev.files), default=0.0),
                    ("hub", repo.repo_id, rev.commit_hash),
                    rev.size_on_disk,
                    f"{repo.repo_id}@{rev.commit_hash[:10]}",
                )
                for repo in repos
                for rev in repo.revisions
            ]
            + civitai,
            key=lambda c: c.last_read,
        )
        with self._lock:
            busy = set(self._held) | {_identity(k) for k in self._in_use()}
            chosen: list[_Candidate] = []
            kept, left = [], total
            for candidate in candidates:
                if left <= self.budget:
                    break
                if candidate.identity in busy:
                    kept.append(candidate.label)
                    continue
                chosen.append(candidate)
                left -= candidate.size
            hub = [c.identity[2] for c in chosen if c.folder is None]
            if hub and info is not None:
                strategy = info.delete_revisions(*hub)
                left = total - strategy.expected_freed_size - sum(c.size for c in chosen if c.folder is not None)
                # Deleting under the lock: `hold` cannot start reading a revision being deleted.
                strategy.execute()
            for candidate in chosen:
                if candidate.folder is not None:
                    shutil.rmtree(candidate.folder, ignore_errors=True)
        deleted = tuple(c.label for c in chosen)
        return self._report(total + stale, left, deleted, tuple(kept), started)

    def _report(
        self, before: int, after: int, deleted: tuple[str, ...], kept: tuple[str, ...], started: float
    ) -> PruneReport:
        report = PruneReport(before, after, deleted, kept, time.perf_counter() - started)
        self.last_report = report
        if deleted or after > self.budget:
            logger.info(
                "Hub cache: LoRAs %d -> %d bytes (budget %d) in %.3f s; deleted %s; kept in use %s",
                before,
                after,
                self.budget,
                report.seconds,
                ", ".join(deleted) or "nothing",
                ", ".join(kept) or "nothing",
            )
        return report

    def _delete_stale_partials(self) -> int:
        """Delete the Civitai downloads' partial files no download writes any more (a crashed process's, or one
        killed); a version folder left empty goes too unless its version is in use. Returns the bytes freed."""
        folder = self._civitai_dir
        if folder is None or not folder.is_dir():
            return 0
        freed, cutoff = 0, time.time() - self._stale_partial_s
        with self._lock:
            busy = set(self._held) | {_identity(k) for k in self._in_use()}
            for version in (v for v in folder.iterdir() if v.is_dir()):
                for path in version.glob(f"{PARTIAL_PREFIX}*"):
                    with contextlib.suppress(FileNotFoundError):  # its download finished (renamed it) meanwhile
                        stat = path.stat()
                        if stat.st_mtime < cutoff:
                            path.unlink()
                            freed += stat.st_size
                            logger.info("deleted a stale partial download %s (%d bytes)", path, stat.st_size)
                if _civitai_identity(version) not in busy and not any(version.iterdir()):
                    with contextlib.suppress(OSError):  # a file appeared: it stays
                        version.rmdir()
        return freed

    def _civitai_candidates(self) -> tuple[list[_Candidate], int]:
        """Each Civitai version's folder as a candidate, and the bytes of downloads in progress (never chosen)."""
        folder = self._civitai_dir
        if folder is None or not folder.is_dir():
            return [], 0
        candidates, partial = [], 0
        for version in folder.iterdir():
            if not version.is_dir():
                continue
            files = [(f, f.stat()) for f in version.iterdir() if f.is_file()]
            partial += sum(stat.st_size for f, stat in files if f.name.startswith(PARTIAL_PREFIX))
            done = [(f, stat) for f, stat in files if not f.name.startswith(PARTIAL_PREFIX)]
            if not done:
                continue
            identity = _civitai_identity(version)
            candidates.append(
                _Candidate(
                    max(stat.st_mtime for _, stat in done),
                    identity,
                    sum(stat.st_size for _, stat in done),
                    identity[1],
                    version,
                )
            )
        return candidates, partial

    def _lora_repos(self) -> list:
        try:
            info = scan_cache_dir(self._cache_dir)
        except CacheNotFound:
            return []
        return [r for r in info.repos if r.repo_type == "model" and r.repo_id not in self._keep_repos]

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._worker = None
                    return
                self._pending = False
            try:
                self.prune()
            except OSError as e:
                logger.warning("pruning the LoRA disk caches failed: %s", e)


def _civitai_identity(version: Path) -> _Revision:
    """What a Civitai version's folder (named by its version id) holds: as `_identity` names its key."""
    return ("civitai", f"civitai:{version.name}", version.name)


def _identity(key: AdapterKey) -> _Revision:
    """What `key` is on disk: a Hub revision, or a Civitai version (its ref and version id)."""
    return (key.source, key.name, key.revision)
