"""The Hub disk cache, pruned least recently used first to a byte budget with huggingface_hub's own tools.

LoRA files are downloaded into the Hub cache (`hf_hub_download`), which never shrinks by itself. After
each download a background thread scans it (`scan_cache_dir`) and, while the LoRA repos in it take more
than the budget, deletes whole revisions (`HFCacheInfo.delete_revisions`, which also removes blobs no
other revision shares), least recently read first. Two kinds of revision are never deleted:

- the served model's own repos (the base pipeline, a VAE): the budget is for LoRAs;
- revisions in use: an adapter being resolved, downloaded or read (held with `hold`), or one leased or
  fused in the engine's store. `hold` and the deletion share one lock, so a revision checked as unused
  cannot become used before it is gone, and a revision held is never deleted under a reader.
"""

from __future__ import annotations

import logging
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

__all__ = ["DiskCache", "PruneReport"]

logger = logging.getLogger(__name__)

_Revision = tuple[str, str]  # (repo id, commit sha)


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
    ) -> None:
        self.budget = budget
        self._cache_dir = cache_dir
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
        revision = (key.name, key.revision)
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
        """Bytes the LoRA repos take in the Hub cache now (the served model's repos excluded)."""
        return sum(r.size_on_disk for r in self._lora_repos())

    def prune(self) -> PruneReport:
        """Delete least recently used LoRA revisions until the LoRA repos fit the budget."""
        started = time.perf_counter()
        try:
            info = scan_cache_dir(self._cache_dir)
        except CacheNotFound:
            return PruneReport(0, 0, (), (), time.perf_counter() - started)
        except CorruptedCacheException as e:
            logger.warning("the Hub cache could not be scanned, nothing pruned: %s", e)
            return PruneReport(0, 0, (), (), time.perf_counter() - started)
        repos = [r for r in info.repos if r.repo_type == "model" and r.repo_id not in self._keep_repos]
        total = sum(r.size_on_disk for r in repos)
        if total <= self.budget:
            return self._report(total, total, (), (), started)
        # Least recently read first: a revision's last access is its most recently read file's.
        revisions = sorted(
            (
                (max((f.blob_last_accessed for f in rev.files), default=0.0), repo.repo_id, rev)
                for repo in repos
                for rev in repo.revisions
            ),
            key=lambda item: item[0],
        )
        with self._lock:
            busy = set(self._held) | {(k.name, k.revision) for k in self._in_use() if k.source == "hub"}
            chosen, kept, left = [], [], total
            for _, repo_id, rev in revisions:
                if left <= self.budget:
                    break
                if (repo_id, rev.commit_hash) in busy:
                    kept.append(f"{repo_id}@{rev.commit_hash[:10]}")
                    continue
                chosen.append((repo_id, rev.commit_hash))
                left -= rev.size_on_disk
            if chosen:
                strategy = info.delete_revisions(*(sha for _, sha in chosen))
                left = total - strategy.expected_freed_size
                # Deleting under the lock: `hold` cannot start reading a revision being deleted.
                strategy.execute()
        deleted = tuple(f"{repo}@{sha[:10]}" for repo, sha in chosen)
        return self._report(total, left, deleted, tuple(kept), started)

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
                logger.warning("pruning the Hub cache failed: %s", e)
