"""Checking the strings users type: repo ids, revisions, weight file names and `local:` refs.

These run before anything touches the network or the disk, so a path-like
value (`../x`, `/etc/passwd`, `C:\\x`, a URL) never reaches a URL or a path.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from .cards import MAX_REPO_ID_CHARS, PICKLE_SUFFIXES, REPO_ID_PATTERN
from .errors import InvalidRepoIdError, InvalidRequestError, InvalidWeightNameError
from .pairs import SEPARATOR, split_pair

__all__ = [
    "LOCAL_PREFIX",
    "is_commit_sha",
    "is_local_ref",
    "local_ref",
    "parse_local_ref",
    "validate_repo_id",
    "validate_revision",
    "validate_weight_name",
]

LOCAL_PREFIX = "local:"
_ACCEPTED_REPO = (
    "accepted form: 'owner/name' (letters, digits, '-', '_', '.'; no '..' or '--'), "
    f"at most {MAX_REPO_ID_CHARS} characters"
)
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_MAX_REVISION_CHARS = 256
_MAX_PATH_CHARS = 512


def validate_repo_id(value: str, *, what: str = "LoRA repo id") -> str:
    """The repo id with surrounding blanks removed; InvalidRepoIdError naming `what` and the value otherwise."""
    if not isinstance(value, str):
        raise InvalidRepoIdError(f"{what} {value!r} is a {type(value).__name__}; {_ACCEPTED_REPO}")
    repo_id = value.strip()
    reason = None
    if not repo_id:
        reason = "it is empty"
    elif len(repo_id) > MAX_REPO_ID_CHARS:
        reason = f"it is {len(repo_id)} characters long"
    elif "://" in repo_id or repo_id.lower().startswith(("http:", "https:", "www.")):
        reason = "it is a URL"
    elif "\\" in repo_id or repo_id.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", repo_id):
        reason = "it is a file path"
    elif ".." in repo_id.split("/") or "../" in repo_id or "/.." in repo_id:
        reason = "it contains '..'"
    elif not REPO_ID_PATTERN.match(repo_id):
        reason = "it is not owner/name"
    if reason:
        raise InvalidRepoIdError(f"{what} {value!r} is not accepted ({reason}); {_ACCEPTED_REPO}")
    return repo_id


def validate_revision(value: str | None) -> str | None:
    """A branch, tag or commit sha, or None for the default branch."""
    if value is None:
        return None
    revision = value.strip() if isinstance(value, str) else value
    if (
        not isinstance(revision, str)
        or not revision
        or len(revision) > _MAX_REVISION_CHARS
        or not _REVISION.match(revision)
        or ".." in revision
    ):
        raise InvalidRequestError(
            f"revision {value!r} is not accepted; accepted: a branch or tag name or a 40-hex commit sha "
            "(letters, digits, '.', '_', '-', '/'; no '..')"
        )
    return revision


def is_commit_sha(revision: str | None) -> bool:
    return revision is not None and bool(_COMMIT_SHA.match(revision))


def validate_weight_name(value: str | None) -> str | None:
    """A relative POSIX path to a `.safetensors` file inside the repo, or None to let the repo decide; or a pair of
    files (`lora_catalog.pairs`): a folder ending in '/', or two files joined with '+'."""
    if value is None:
        return None
    name = value.strip() if isinstance(value, str) else value
    if not isinstance(name, str) or not name:
        raise InvalidWeightNameError(f"weight_name {value!r} is empty; accepted: a '.safetensors' file in the repo")
    if name.endswith("/") and len(name) > 1:
        _check_relative(name.removesuffix("/"), "weight_name", value, InvalidWeightNameError)
        return name
    pair = split_pair(name)
    if pair is not None:
        return SEPARATOR.join(_one_weight_name(half, value) for half in pair)
    return _one_weight_name(name, value)


def _one_weight_name(name: str, value: str) -> str:
    _check_relative(name, "weight_name", value, InvalidWeightNameError)
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise InvalidWeightNameError(
            f"weight_name {value!r} is a pickle file; only '.safetensors' files are accepted (pickles are never "
            "unpickled)"
        )
    if not name.lower().endswith(".safetensors"):
        raise InvalidWeightNameError(
            f"weight_name {value!r} is not accepted; accepted: a '.safetensors' file, or a pair of files as a folder "
            "ending in '/' or as 'a.safetensors+b.safetensors'"
        )
    return name


def is_local_ref(ref: str) -> bool:
    return ref.startswith(LOCAL_PREFIX)


def local_ref(relative: PurePosixPath) -> str:
    return f"{LOCAL_PREFIX}{relative.as_posix()}"


def parse_local_ref(ref: str) -> PurePosixPath:
    """The relative path inside a local LoRA folder that `local:<path>` names."""
    if not is_local_ref(ref):
        raise InvalidRepoIdError(f"{ref!r} is not a local ref; accepted form: 'local:<relative path>.safetensors'")
    path = ref[len(LOCAL_PREFIX) :].strip()
    if not path:
        raise InvalidRepoIdError(f"local ref {ref!r} names no file; accepted form: 'local:<relative path>.safetensors'")
    _check_relative(path, "local ref", ref, InvalidRepoIdError)
    return PurePosixPath(path)


def _check_relative(path: str, what: str, original: str, error: type[InvalidRequestError]) -> None:
    parts = path.split("/")
    if (
        len(path) > _MAX_PATH_CHARS
        or "\\" in path
        or path.startswith("/")
        or re.match(r"^[A-Za-z]:", path)
        or "://" in path
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise error(
            f"{what} {original!r} is not accepted; accepted: a relative path with '/' separators, "
            f"no '.', '..' or empty parts, at most {_MAX_PATH_CHARS} characters"
        )
