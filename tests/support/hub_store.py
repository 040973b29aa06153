"""On-disk repository store behind the stand-in Hub: repos, branches, commits and their files.

Layout under ``root`` (one folder per repo, named like the Hub cache does so no two repo ids collide)::

    models--<owner>--<name>/meta.json                 repo attributes, branches and every commit's file list
    models--<owner>--<name>/commits/<sha>/<path>      the files of each commit

A store opened on a root that already holds repos serves them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

__all__ = [
    "Commit",
    "HubSetupError",
    "RepoRecord",
    "RepoStore",
    "StoredFile",
    "format_hub_date",
    "lfs_pointer",
    "parse_card_data",
]

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)
# The Hub's default .gitattributes sends these to LFS; big files go there whatever their name.
_LFS_SUFFIXES = frozenset({".safetensors", ".bin", ".ckpt", ".pt", ".pth", ".onnx", ".msgpack", ".h5", ".gguf"})
_LFS_MIN_SIZE = 10 * 1024 * 1024
_GATED_MODES = ("auto", "manual")


class HubSetupError(ValueError):
    """A repo given to the stand-in Hub is not one the real Hub could hold."""


@dataclass(frozen=True)
class StoredFile:
    path: str
    size: int
    git_oid: str  # git blob sha1 of what git stores: the content, or the LFS pointer
    sha256: str
    lfs: bool

    @property
    def etag(self) -> str:
        # The client names cache blobs by ETag: the Hub uses sha256 for LFS files and the git sha1 otherwise.
        return self.sha256 if self.lfs else self.git_oid

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))


@dataclass(frozen=True)
class Commit:
    sha: str
    revision: str
    last_modified: datetime
    explicit_tags: tuple[str, ...]
    card_data: Mapping[str, Any] | None
    files: tuple[StoredFile, ...]

    def file(self, path: str) -> StoredFile | None:
        return next((f for f in self.files if f.path == path), None)


@dataclass(frozen=True)
class RepoRecord:
    repo_id: str
    private: bool
    gated: str | bool  # False, "auto" or "manual", as the Hub reports it
    downloads: int
    likes: int
    trending_score: int
    created_at: datetime
    branches: Mapping[str, str]  # branch name -> commit sha
    commits: Mapping[str, Commit]

    @property
    def author(self) -> str | None:
        return self.repo_id.split("/")[0] if "/" in self.repo_id else None

    @property
    def default_branch(self) -> str:
        return "main" if "main" in self.branches else next(iter(self.branches))

    def head(self) -> Commit:
        return self.commits[self.branches[self.default_branch]]

    def resolve(self, revision: str) -> Commit | None:
        """A branch name or a full commit sha of this repo."""
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        return self.commits.get(revision.lower())


def format_hub_date(moment: datetime) -> str:
    """The Hub's timestamp format, e.g. ``2024-05-01T12:00:00.000Z``."""
    utc = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _parse_hub_date(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _stored_file(path: str, content: bytes) -> StoredFile:
    sha256 = hashlib.sha256(content).hexdigest()
    lfs = PurePosixPath(path).suffix.lower() in _LFS_SUFFIXES or len(content) >= _LFS_MIN_SIZE
    git_oid = _git_blob_sha1(lfs_pointer(sha256, len(content)) if lfs else content)
    return StoredFile(path=path, size=len(content), git_oid=git_oid, sha256=sha256, lfs=lfs)


def _normalise_path(path: str) -> str:
    parts = PurePosixPath(path).parts
    if not path or "\\" in path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise HubSetupError(f"file path {path!r} is not a relative POSIX path without '.' or '..' parts")
    return "/".join(parts)


def _normalise_gated(gated: bool | str) -> str | bool:
    if gated is True:
        return "auto"
    if gated is False:
        return False
    if gated in _GATED_MODES:
        return gated
    raise HubSetupError(f"gated={gated!r} is not accepted: use True, False, 'auto' or 'manual'")


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_card_data(readme: bytes | None) -> dict[str, Any] | None:
    """The YAML front matter of a model card, or None when there is none or it is not a mapping."""
    if readme is None:
        return None
    match = _FRONT_MATTER.match(readme.decode("utf-8", errors="replace"))
    if match is None:
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as e:
        # The real Hub refuses such pushes; here the card is served without metadata so tests still run.
        logger.warning("model card front matter is not valid YAML (%s); serving no card data", e)
        return None
    return data if isinstance(data, dict) else None


def _commit_sha(repo_id: str, files: Sequence[StoredFile], revision: str) -> str:
    # The repo id is hashed too so that two repos with equal files still have distinct commits, as on the Hub.
    digest = hashlib.sha1(repo_id.encode() + b"\0")
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.sha256}\n".encode())
    digest.update(revision.encode())
    return digest.hexdigest()


def _commit_to_json(commit: Commit) -> dict[str, Any]:
    return {
        "revision": commit.revision,
        "lastModified": format_hub_date(commit.last_modified),
        "explicitTags": list(commit.explicit_tags),
        "cardData": commit.card_data,
        "files": [
            {"path": f.path, "size": f.size, "oid": f.git_oid, "sha256": f.sha256, "lfs": f.lfs} for f in commit.files
        ],
    }


def _commit_from_json(sha: str, data: Mapping[str, Any]) -> Commit:
    files = tuple(
        StoredFile(path=f["path"], size=f["size"], git_oid=f["oid"], sha256=f["sha256"], lfs=f["lfs"])
        for f in data["files"]
    )
    return Commit(
        sha=sha,
        revision=data["revision"],
        last_modified=_parse_hub_date(data["lastModified"]),
        explicit_tags=tuple(data["explicitTags"]),
        card_data=data["cardData"],
        files=files,
    )


def _record_to_json(record: RepoRecord) -> dict[str, Any]:
    return {
        "id": record.repo_id,
        "private": record.private,
        "gated": record.gated,
        "downloads": record.downloads,
        "likes": record.likes,
        "trendingScore": record.trending_score,
        "createdAt": format_hub_date(record.created_at),
        "branches": dict(record.branches),
        "commits": {sha: _commit_to_json(c) for sha, c in record.commits.items()},
    }


def _record_from_json(data: Mapping[str, Any]) -> RepoRecord:
    return RepoRecord(
        repo_id=data["id"],
        private=data["private"],
        gated=data["gated"],
        downloads=data["downloads"],
        likes=data["likes"],
        trending_score=data["trendingScore"],
        created_at=_parse_hub_date(data["createdAt"]),
        branches=dict(data["branches"]),
        commits={sha: _commit_from_json(sha, c) for sha, c in data["commits"].items()},
    )


class RepoStore:
    """Thread-safe repos kept both in memory (for serving) and on disk (for inspection and reuse)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._repos: dict[str, RepoRecord] = {}
        for meta in sorted(self.root.glob("models--*/meta.json")):
            record = _record_from_json(json.loads(meta.read_text(encoding="utf-8")))
            self._repos[record.repo_id] = record

    def repo_dir(self, repo_id: str) -> Path:
        return self.root / f"models--{repo_id.replace('/', '--')}"

    def commit_dir(self, repo_id: str, sha: str) -> Path:
        return self.repo_dir(repo_id) / "commits" / sha

    def get(self, repo_id: str) -> RepoRecord | None:
        with self._lock:
            return self._repos.get(repo_id)

    def all(self) -> list[RepoRecord]:
        with self._lock:
            return list(self._repos.values())

    def read(self, repo_id: str, sha: str, path: str) -> bytes:
        return (self.commit_dir(repo_id, sha) / path).read_bytes()

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        tags: Sequence[str],
        downloads: int,
        likes: int,
        trending_score: int,
        created_at: datetime | None,
        last_modified: datetime | None,
        gated: bool | str,
        private: bool,
        revision: str,
        card_data_override: Mapping[str, Any] | None,
    ) -> str:
        if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
            raise HubSetupError(f"repo id {repo_id!r} is not valid: use 'name' or 'owner/name' without '--' or '..'")
        if not _REVISION.match(revision) or ".." in revision:
            raise HubSetupError(f"revision {revision!r} is not a valid branch name")
        contents = {_normalise_path(path): bytes(data) for path, data in files.items()}
        if not contents:
            raise HubSetupError(f"repo {repo_id!r} needs at least one file")
        gated_mode = _normalise_gated(gated)
        stored = tuple(_stored_file(path, data) for path, data in sorted(contents.items()))
        sha = _commit_sha(repo_id, stored, revision)
        card = (
            dict(card_data_override) if card_data_override is not None else parse_card_data(contents.get("README.md"))
        )
        if card is not None:
            # YAML yields dates and other non-JSON values; the Hub serves them as strings.
            card = json.loads(json.dumps(card, default=str))
        now = datetime.now(UTC)
        commit = Commit(
            sha=sha,
            revision=revision,
            last_modified=_utc(last_modified) if last_modified else now,
            explicit_tags=tuple(tags),
            card_data=card,
            files=stored,
        )
        commit_dir = self.commit_dir(repo_id, sha)
        for path, data in contents.items():
            target = commit_dir / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        with self._lock:
            previous = self._repos.get(repo_id)
            if created_at is not None:
                created = _utc(created_at)
            else:
                created = previous.created_at if previous else commit.last_modified
            record = RepoRecord(
                repo_id=repo_id,
                private=private,
                gated=gated_mode,
                downloads=downloads,
                likes=likes,
                trending_score=trending_score,
                created_at=created,
                branches={**(previous.branches if previous else {}), revision: sha},
                commits={**(previous.commits if previous else {}), sha: commit},
            )
            self._repos[repo_id] = record
            meta = self.repo_dir(repo_id) / "meta.json"
            meta.write_text(json.dumps(_record_to_json(record), indent=2, sort_keys=True), encoding="utf-8")
        logger.debug("stand-in Hub: %s@%s is now commit %s (%d files)", repo_id, revision, sha, len(stored))
        return sha
