"""From a LoRA reference to an adapter ready in the host cache: the one preparation path, top to bottom.

`Preparer.adapter` takes one LoRA already parsed and validated by `normalise.normalise_request`, then runs
resolve → fetch → header → check (the one origin judgement) → prepare (diffusers' converters) → store, each in
the module that owns it; size limits are checked before anything is downloaded. A cached adapter skips all
but resolve; the rest runs once per adapter at a time (single-flight per key), so two requests for the same
cold LoRA download it once. Fetch to prepare hold the load gate (a request's, or the prefetches' own) for the
file's bytes, plus the most a kept float32 ΔW (LoHa, DoRA) may take; every download is followed by a disk-cache
prune, whether the LoRA is then used or refused. Each step and its module: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.caches.disk import DiskCache
from engine.caches.store import AdapterStore
from engine.errors import InvalidRequestError
from engine.families.origin import LoraOrigin, check_origin, judge_origin, made_for_sibling, without_fallen_layers
from engine.formats.adapters import AdapterKey, PreparedAdapter, prepare
from engine.formats.deltas import may_keep_delta
from engine.formats.pivotal import TextEncoders
from engine.formats.targets import TargetTable
from engine.prepare.loadgate import LoadGate
from engine.prepare.resolve import AdapterResolver, AdapterSource
from engine.prepare.stages import Half, Stages
from engine.requests import LoraSpec
from engine.video_references import TRAINED_DOWNSCALE_KEY
from families import Base
from lora_catalog.hints import LoraHints, metadata_hints
from lora_catalog.sft_header import addnet_hash

__all__ = ["Lane", "PreparedLora", "Preparer"]

logger = logging.getLogger(__name__)

# Which load gate a preparation waits in: a queued request's, or a prefetch's (engine.pools.prefetch).
Lane = Literal["request", "prefetch"]


@dataclass(frozen=True)
class PreparedLora:
    """One LoRA made ready: the adapter (leased by the caller), whether the cache had it, and the time spent."""

    adapter: PreparedAdapter
    cache: Literal["hit", "miss"]
    resolve_s: float
    prepare_s: float
    warnings: tuple[str, ...] = ()
    # The fine-tune it was trained for, when it runs on a pool of another base (see `_trained_for`).
    trained_for: str | None = None
    # What the LoRA recommends: its catalogue entry's (card, Civitai page, name) over its file's own.
    hints: LoraHints = field(default_factory=LoraHints)


@dataclass
class _KeyLock:
    # Mutable, touched only under Preparer._locks_guard (`users`) or as the lock itself.
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class Preparer:
    def __init__(
        self,
        resolver: AdapterResolver,
        store: AdapterStore,
        table: TargetTable,
        encoders: TextEncoders,
        *,
        served_base: str,
        max_rank: int,
        disk: DiskCache | None = None,
        gate: LoadGate | None = None,
        prefetch_gate: LoadGate | None = None,
        delta_budget: int = 0,
        stages: Stages | None = None,
    ) -> None:
        self._resolver = resolver
        # A two-stage pool's (Wan 2.2 A14B): a file's stage, and pairs (engine.prepare.stages).
        self._stages = stages
        self._disk = disk
        self._store = store
        self._table = table
        self._encoders = encoders
        self._served_base = served_base
        self._max_rank = max_rank
        # Requests' loads, and prefetches' (engine.pools.prefetch): a prefetch never takes a request's place.
        self._gates: dict[Lane, LoadGate | None] = {"request": gate, "prefetch": prefetch_gate}
        self._delta_budget = delta_budget
        self._locks_guard = threading.Lock()
        self._key_locks: dict[AdapterKey, _KeyLock] = {}

    def adapter(self, spec: LoraSpec, leased: list[AdapterKey], *, lane: Lane = "request") -> PreparedLora:
        """Steps 2–7 for one normalised spec; its key is appended to `leased` (the caller releases it). `lane`
        names the load gate it waits in: a request's, or the prefetches' own."""
        started = time.perf_counter()
        source = self._resolver.locate(spec)
        trained_for, warnings = self._trained_for(source)
        self._store.lease([source.key])
        leased.append(source.key)
        cached = self._store.get(source.key)
        if cached is not None:
            hints = _hints(source, cached)
            return PreparedLora(cached, "hit", time.perf_counter() - started, 0.0, warnings, trained_for, hints)
        with self._key_lock(source.key):
            cached = self._store.get(source.key)
            if cached is not None:
                elapsed = time.perf_counter() - started
                return PreparedLora(cached, "hit", elapsed, 0.0, warnings, trained_for, _hints(source, cached))
            try:
                # The in-flight bound (engine.prepare.loadgate) covers the download and the parse: what costs RAM.
                with ExitStack() as gate, self._disk.hold(source.key) if self._disk is not None else nullcontext():
                    adapter, fetched = self._load(source, gate, self._gates[lane])
                    adapter = self._store.add(adapter)
            finally:
                if self._disk is not None and source.local_path is None:
                    # A download grows the Hub cache whether the file is then used or refused (a wrong base, a
                    # rank over the limit, NaN values): prune it off the request's path either way.
                    self._disk.schedule()
        done = time.perf_counter()
        logger.info(
            "prepared %s: %d layers, rank %d, %d pivotal tokens, %.1f MiB in %.3f s (resolve and download %.3f s)",
            source.key,
            len(adapter.layers),
            adapter.max_rank,
            len(adapter.embeddings.tokens) if adapter.embeddings is not None else 0,
            adapter.nbytes / 2**20,
            done - fetched,
            fetched - started,
        )
        hints = _hints(source, adapter)
        return PreparedLora(adapter, "miss", fetched - started, done - fetched, warnings, trained_for, hints)

    def _trained_for(self, source: AdapterSource) -> tuple[str | None, tuple[str, ...]]:
        """A LoRA trained for a fine-tune (Civitai's Pony, ...) routed here because no pool serves that fine-tune:
        the fine-tune's name, and the source's warnings with one saying so; else None and them unchanged."""
        served = self._served_base.lower()
        if source.finetune is None or any(base.lower() == served for base in source.declared_bases):
            return None, source.warnings
        note = (
            f"LoRA {source.ref!r} was trained for {source.finetune}, which no pool here serves; it runs on "
            f"{self._served_base}, a different checkpoint of the same family, so it may look different"
        )
        return source.finetune, (*source.warnings, note)

    def _load(
        self, source: AdapterSource, gate: ExitStack, load_gate: LoadGate | None
    ) -> tuple[PreparedAdapter, float]:
        """Steps 3-6 inside the load gate (held on `gate`): the file's bytes for the download and the parse, and
        for a file that may keep a float32 ΔW (LoHa, DoRA) the most that ΔW may take (`delta_budget`) besides."""
        label = f"LoRA {source.ref!r}"
        # The sizes checked against MAX_ADAPTER_BYTES (a pair's two together) are the ones the gate holds.
        source = self._resolver.measure(source)
        size = (source.size or 0) + (source.embeddings_size or 0)
        _hold(gate, load_gate, size, source)
        path = self._resolver.fetch(source)
        pair_path = self._resolver.fetch_pair(source)
        embeddings_path = self._resolver.fetch_embeddings(source)
        fetched = time.perf_counter()
        measured = self._resolver.fetched_bytes(source, (path, pair_path), embeddings_path)
        if measured != size:
            # A size only the download told exactly (Civitai's sizeKB is rounded; a file its API gave none for
            # at all): checked, and held for the parse, the gate taken afresh as below.
            gate.close()
            size = measured
            _hold(gate, load_gate, size, source)
        # A Hub pair's halves by their paths in the repo (what the recipe names), a file elsewhere by its name.
        names = source.halves or (path.name, pair_path.name if pair_path is not None else "")
        half = self._file(source, path, gate, load_gate, size, names[0])
        adapter = half.adapter
        if pair_path is not None and self._stages is not None:
            other = self._file(source, pair_path, gate, load_gate, size, names[1])
            adapter = self._stages.pair(label, (half, other))
        elif pair_path is not None:
            raise InvalidRequestError(
                f"{label} is a pair of files (high- and low-noise), but this pool has one transformer; accepted: "
                "one file"
            )
        elif self._stages is not None:
            adapter = self._stages.one(label, half)
        embeddings = self._encoders.load(embeddings_path, label) if embeddings_path is not None else None
        return dataclasses.replace(adapter, embeddings=embeddings), fetched

    def _file(
        self, source: AdapterSource, path: Path, gate: ExitStack, load_gate: LoadGate | None, size: int, name: str
    ) -> Half:
        """One file checked (its base: the one origin judgement) and prepared, with its hints and hash."""
        label = f"LoRA {source.ref!r}"
        header = self._resolver.header(source, path)
        if self._delta_budget and may_keep_delta(header.tensors):
            # Taken afresh rather than grown: nothing of the download is in RAM until the parse, and a load that
            # waits holding nothing cannot deadlock with another one growing too.
            gate.close()
            _hold(gate, load_gate, size + self._delta_budget, source)
        shapes = {name: info.shape for name, info in header.tensors.items()}
        origin: LoraOrigin = judge_origin(
            source.declared_bases, lambda: (header.metadata, shapes), declared_family=source.declared_family
        )
        warning = check_origin(label, origin, self._served_base)
        shapes, dropped = without_fallen_layers(label, origin, self._served_base, shapes)
        adapter = prepare(
            path,
            source.key,
            self._table,
            max_rank=self._max_rank,
            metadata=header.metadata,
            shapes=shapes,
            delta_budget=self._delta_budget,
        )
        hints = metadata_hints(header.metadata, (source.key.weight_name,))
        sibling = made_for_sibling(origin, self._served_base)
        unused = _sibling_settings(label, source.hints.over(hints), sibling, self._served_base) if sibling else None
        # Kept with the adapter, so a cache hit still tells the user what the first load found; the hash is the
        # recipe's (`Lora hashes`), read once here, off the GPU's path.
        adapter = dataclasses.replace(
            adapter,
            warnings=tuple(w for w in (warning, unused, dropped, *adapter.warnings) if w),
            hints=hints,
            file_hash=addnet_hash(path)[:12],
            trained_downscale=header.metadata.get(TRAINED_DOWNSCALE_KEY),
            sibling=sibling.repo_id if sibling else None,
        )
        return Half(name, adapter, origin, header.metadata)

    @contextmanager
    def _key_lock(self, key: AdapterKey) -> Iterator[None]:
        """One preparation of `key` at a time; the lock lives while someone holds or waits for it, so the table
        holds the keys being prepared now, not every key ever prepared."""
        with self._locks_guard:
            entry = self._key_locks.setdefault(key, _KeyLock())
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._locks_guard:
                entry.users -= 1
                if entry.users == 0:
                    del self._key_locks[key]


def _hold(stack: ExitStack, gate: LoadGate | None, nbytes: int, source: AdapterSource) -> None:
    if gate is not None:
        stack.enter_context(gate.hold(nbytes, str(source.key)))


def _hints(source: AdapterSource, adapter: PreparedAdapter) -> LoraHints:
    hints = source.hints.over(adapter.hints)
    return hints.for_a_sibling() if adapter.sibling else hints


def _sibling_settings(label: str, hints: LoraHints, sibling: Base, served_base: str) -> str | None:
    """The note on the steps and guidance a LoRA made for `sibling` recommends (that checkpoint's, where it is not
    a speed LoRA): the pool runs at its own unless the request names them; None when it recommends neither."""
    kept = hints.for_a_sibling()
    unused = [
        f"{value:g} steps" if name == "steps" else f"guidance {value:g}"
        for name in ("steps", "guidance")
        if (value := getattr(hints, name)) is not None and getattr(kept, name) is None
    ]
    if not unused:
        return None
    where = hints.source("steps") or hints.source("guidance")
    note = (
        f"{label}: {where} recommends {' and '.join(unused)}, {sibling.display_name}'s settings; not used on "
        f"{served_base}, which runs at its own unless the request names them"
    )
    logger.info("%s", note)
    return note
