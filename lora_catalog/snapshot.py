"""Catalogue snapshots: the Hub listing saved as versioned JSON, so the UI opens fast and works offline.

{"format": 1, "base": "<repo id>", "created_at": "<ISO 8601>", "entries": [<LoraEntry.to_json()>, ...]}
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .bases import DEFAULT_BASE
from .entries import LoraEntry, parse_datetime
from .errors import SnapshotError

__all__ = ["SNAPSHOT_FORMAT", "Snapshot", "default_snapshot_path", "read_snapshot", "write_snapshot"]

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1


@dataclass(frozen=True)
class Snapshot:
    base: str
    created_at: datetime
    entries: tuple[LoraEntry, ...]

    @classmethod
    def of(cls, base: str, created_at: datetime, entries: Sequence[LoraEntry]) -> Snapshot:
        return cls(base=base, created_at=created_at, entries=tuple(entries))


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    """Write atomically: readers see the old file or the new one, never half of either."""
    path = Path(path)
    document = {
        "format": SNAPSHOT_FORMAT,
        "base": snapshot.base,
        "created_at": snapshot.created_at.isoformat(),
        "entries": [entry.to_json() for entry in snapshot.entries],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise SnapshotError(f"cannot write snapshot {str(path)!r}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(document, out, ensure_ascii=False, indent=1)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except OSError as e:
        Path(temp).unlink(missing_ok=True)
        raise SnapshotError(f"cannot write snapshot {str(path)!r}: {e.strerror or e}") from e
    logger.info("wrote snapshot %s: %d entries for %s", path, len(snapshot.entries), snapshot.base)


def read_snapshot(path: Path) -> Snapshot:
    """Load a snapshot; a missing, corrupt or unknown-format file raises SnapshotError naming the problem.

    Single entries that cannot be read are skipped with a log line, so one bad
    entry does not cost the whole catalogue.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise SnapshotError(f"snapshot {str(path)!r} does not exist") from e
    except (OSError, UnicodeDecodeError) as e:
        raise SnapshotError(f"cannot read snapshot {str(path)!r}: {e}") from e
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise SnapshotError(
            f"snapshot {str(path)!r} is not valid JSON ({e}); accepted: a file written by refresh"
        ) from e
    if not isinstance(document, dict):
        raise SnapshotError(f"snapshot {str(path)!r} holds a JSON {type(document).__name__}, not an object")
    version = document.get("format")
    if version != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"snapshot {str(path)!r} has format {version!r}; accepted: format {SNAPSHOT_FORMAT} "
            "(regenerate it with `python -m lora_catalog refresh`)"
        )
    base = document.get("base")
    created_at = parse_datetime(document.get("created_at"))
    raw_entries = document.get("entries")
    if not isinstance(base, str) or not base:
        raise SnapshotError(f"snapshot {str(path)!r} has base {base!r}; accepted: a repo id string")
    if created_at is None:
        raise SnapshotError(
            f"snapshot {str(path)!r} has created_at {document.get('created_at')!r}; accepted: an ISO 8601 time"
        )
    if not isinstance(raw_entries, list):
        raise SnapshotError(f"snapshot {str(path)!r} has entries of type {type(raw_entries).__name__}; accepted: list")
    entries = []
    for index, raw in enumerate(raw_entries):
        try:
            entries.append(LoraEntry.from_json(raw))
        except SnapshotError as e:
            logger.warning("snapshot %s: skipping entry %d: %s", path, index, e)
    return Snapshot(base=base, created_at=created_at, entries=tuple(entries))


def default_snapshot_path(base: str) -> Path:
    """`snapshots/sdxl.json` for the default SDXL base, `snapshots/<owner>__<name>.json` otherwise (under CWD)."""
    name = "sdxl" if base == DEFAULT_BASE else base.replace("/", "__")
    return Path("snapshots") / f"{name}.json"
