"""The stand-in Hub's JSON: model documents, model listings and repo trees, shaped like the real Hub's."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .hub_store import Commit, RepoRecord, StoredFile, format_hub_date

__all__ = [
    "BadQuery",
    "ListQuery",
    "TreeQuery",
    "encode_cursor",
    "hub_tags",
    "list_page",
    "model_document",
    "parse_expand",
    "parse_list_query",
    "parse_tree_query",
    "tree_page",
]

# What `HfApi.list_models(expand=...)`/`model_info(expand=...)` may ask for (huggingface_hub's ExpandModelProperty_T).
EXPANDABLE = frozenset(
    {
        "author",
        "baseModels",
        "cardData",
        "childrenModelCount",
        "config",
        "createdAt",
        "disabled",
        "downloads",
        "downloadsAllTime",
        "evalResults",
        "gated",
        "gguf",
        "inference",
        "inferenceProviderMapping",
        "lastModified",
        "library_name",
        "likes",
        "mask_token",
        "model-index",
        "pipeline_tag",
        "private",
        "resourceGroup",
        "safetensors",
        "sha",
        "siblings",
        "spaces",
        "tags",
        "transformersInfo",
        "trendingScore",
        "usedStorage",
        "widgetData",
    }
)
_ALWAYS = ("_id", "id", "modelId")
_LIST_FIELDS = (
    *_ALWAYS,
    "likes",
    "trendingScore",
    "private",
    "gated",
    "downloads",
    "tags",
    "pipeline_tag",
    "library_name",
    "createdAt",
)
_LIST_FULL_FIELDS = (*_LIST_FIELDS, "author", "sha", "lastModified", "disabled", "siblings")
_INFO_FIELDS = (*_LIST_FULL_FIELDS, "cardData", "widgetData", "spaces", "usedStorage")
_SORT_KEYS = {
    "downloads": "downloads",
    "likes": "likes",
    "trendingScore": "trendingScore",
    "trending_score": "trendingScore",
    "lastModified": "lastModified",
    "last_modified": "lastModified",
    "createdAt": "createdAt",
    "created_at": "createdAt",
}
_TRUE = frozenset({"1", "true", "True", "yes"})
_HUB_MAX_PAGE = 1000
_HUB_MAX_EXPANDED_TREE_PAGE = 50


class BadQuery(ValueError):
    """A query parameter the real Hub would answer with 400."""


@dataclass(frozen=True)
class ListQuery:
    filters: tuple[str, ...]
    search: str | None
    author: str | None
    pipeline_tag: str | None
    gated: bool | None
    sort: str | None
    descending: bool
    page_size: int
    offset: int
    expand: tuple[str, ...]
    full: bool
    card_data: bool


@dataclass(frozen=True)
class TreeQuery:
    recursive: bool
    expand: bool
    page_size: int
    offset: int


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        offset = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["offset"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadQuery(f"cursor {cursor!r} is not a cursor this Hub handed out") from e
    if not isinstance(offset, int) or offset < 0:
        raise BadQuery(f"cursor {cursor!r} is not a cursor this Hub handed out")
    return offset


def _last(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _flag(query: Mapping[str, Sequence[str]], name: str) -> bool:
    return _last(query, name) in _TRUE


def _int_param(query: Mapping[str, Sequence[str]], name: str, default: int, *, minimum: int) -> int:
    text = _last(query, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError as e:
        raise BadQuery(f"{name}={text!r} is not an integer") from e
    if value < minimum:
        raise BadQuery(f"{name}={value} must be at least {minimum}")
    return value


def parse_expand(query: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`expand` as the client sends it (repeated), or as `expand[]`, or comma-separated."""
    raw = [*query.get("expand", ()), *query.get("expand[]", ())]
    names = tuple(name for value in raw for name in value.split(",") if name)
    unknown = sorted(set(names) - EXPANDABLE)
    if unknown:
        raise BadQuery(f"expand value(s) {unknown} are not accepted; accepted: {sorted(EXPANDABLE)}")
    return names


def parse_list_query(query: Mapping[str, Sequence[str]], *, default_page_size: int) -> ListQuery:
    sort_name = _last(query, "sort")
    if sort_name is not None and sort_name not in _SORT_KEYS:
        raise BadQuery(f"sort={sort_name!r} is not accepted; accepted: {sorted(_SORT_KEYS)}")
    direction = _last(query, "direction") or "-1"
    if direction not in ("-1", "1"):
        raise BadQuery(f"direction={direction!r} is not accepted; accepted: '-1' (descending) or '1' (ascending)")
    gated = _last(query, "gated")
    cursor = _last(query, "cursor")
    return ListQuery(
        filters=tuple(query.get("filter", ())),
        search=_last(query, "search"),
        author=_last(query, "author"),
        pipeline_tag=_last(query, "pipeline_tag"),
        gated=None if gated is None else gated in _TRUE,
        sort=_SORT_KEYS[sort_name] if sort_name else None,
        descending=direction == "-1",
        page_size=min(_int_param(query, "limit", default_page_size, minimum=1), _HUB_MAX_PAGE),
        offset=_decode_cursor(cursor) if cursor else 0,
        expand=parse_expand(query),
        full=_flag(query, "full"),
        card_data=_flag(query, "cardData"),
    )


def parse_tree_query(query: Mapping[str, Sequence[str]], *, default_page_size: int) -> TreeQuery:
    expand = _flag(query, "expand")
    cap = _HUB_MAX_EXPANDED_TREE_PAGE if expand else _HUB_MAX_PAGE
    cursor = _last(query, "cursor")
    return TreeQuery(
        recursive=_flag(query, "recursive"),
        expand=expand,
        page_size=min(default_page_size, cap),
        offset=_decode_cursor(cursor) if cursor else 0,
    )


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    return [] if value is None else [value]


def _base_models(card: Mapping[str, Any]) -> list[str]:
    return [b for b in _as_list(card.get("base_model")) if isinstance(b, str)]


def _relation(card: Mapping[str, Any], tags: Iterable[str]) -> str | None:
    relation = card.get("base_model_relation")
    if isinstance(relation, str):
        return relation
    return "adapter" if "lora" in tags else None


def hub_tags(commit: Commit) -> list[str]:
    """Explicit tags, the card's tags, then the tags the Hub derives from the card (base model, license)."""
    card = commit.card_data or {}
    tags = [*commit.explicit_tags, *(t for t in _as_list(card.get("tags")) if isinstance(t, str))]
    relation = _relation(card, tags)
    if relation is not None:
        for base in _base_models(card):
            tags += [f"base_model:{base}", f"base_model:{relation}:{base}"]
    if isinstance(card.get("license"), str):
        tags.append(f"license:{card['license']}")
    return list(dict.fromkeys(tags))


def _card_str(card: Mapping[str, Any], key: str) -> str | None:
    value = card.get(key)
    return value if isinstance(value, str) else None


def _sibling(file_entry: StoredFile, blobs: bool) -> dict[str, Any]:
    sibling: dict[str, Any] = {"rfilename": file_entry.path}
    if blobs:
        sibling.update(size=file_entry.size, blobId=file_entry.git_oid)
        if file_entry.lfs:
            sibling["lfs"] = {
                "size": file_entry.size,
                "sha256": file_entry.sha256,
                "pointerSize": file_entry.pointer_size,
            }
    return sibling


def _all_fields(repo: RepoRecord, commit: Commit, *, blobs: bool) -> dict[str, Any]:
    card = commit.card_data or {}
    tags = hub_tags(commit)
    relation = _relation(card, tags)
    fields: dict[str, Any] = {
        "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.author,
        "sha": commit.sha,
        "lastModified": format_hub_date(commit.last_modified),
        "createdAt": format_hub_date(repo.created_at),
        "private": repo.private,
        "gated": repo.gated,
        "disabled": False,
        "downloads": repo.downloads,
        "downloadsAllTime": repo.downloads,
        "likes": repo.likes,
        "trendingScore": repo.trending_score,
        "tags": tags,
        "library_name": _card_str(card, "library_name"),
        "pipeline_tag": _card_str(card, "pipeline_tag"),
        "siblings": [_sibling(f, blobs) for f in commit.files],
        "spaces": [],
        "usedStorage": sum(f.size for f in commit.files),
        "childrenModelCount": 0,
    }
    if commit.card_data is not None:
        fields["cardData"] = commit.card_data
    if "widget" in card:
        fields["widgetData"] = card["widget"]
    if relation is not None and _base_models(card):
        fields["baseModels"] = {"relation": relation, "models": [{"id": b} for b in _base_models(card)]}
    return fields


def _pick(fields: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return {name: fields[name] for name in dict.fromkeys(names) if name in fields}


def model_document(repo: RepoRecord, commit: Commit, *, expand: Sequence[str], blobs: bool) -> dict[str, Any]:
    """What `GET /api/models/{repo_id}[/revision/{rev}]` answers."""
    fields = _all_fields(repo, commit, blobs=blobs)
    return _pick(fields, (*_ALWAYS, *expand) if expand else _INFO_FIELDS)


def _matches(repo: RepoRecord, tags: Sequence[str], commit: Commit, query: ListQuery) -> bool:
    card = commit.card_data or {}
    return (
        all(f in tags for f in query.filters)
        and (query.search is None or query.search.lower() in repo.repo_id.lower())
        and (query.author is None or repo.author == query.author)
        and (query.pipeline_tag is None or _card_str(card, "pipeline_tag") == query.pipeline_tag)
        and (query.gated is None or bool(repo.gated) == query.gated)
    )


def list_page(repos: Iterable[RepoRecord], query: ListQuery) -> tuple[list[dict[str, Any]], int | None]:
    """One page of `GET /api/models` and the offset of the next page, if any."""
    rows = []
    for repo in repos:
        commit = repo.head()
        if _matches(repo, hub_tags(commit), commit, query):
            rows.append(_all_fields(repo, commit, blobs=False))
    rows.sort(key=lambda row: row["id"])
    if query.sort is not None:
        # Stable sort on top of the id order, so ties come out the same way every time.
        rows.sort(key=lambda row: row[query.sort], reverse=query.descending)
    if query.expand:
        names: tuple[str, ...] = (*_ALWAYS, *query.expand)
    else:
        names = (*(_LIST_FULL_FIELDS if query.full else _LIST_FIELDS), *(("cardData",) if query.card_data else ()))
    end = query.offset + query.page_size
    page = [_pick(row, names) for row in rows[query.offset : end]]
    return page, (end if end < len(rows) else None)


def _tree_oid(folder: str, paths: Iterable[str]) -> str:
    return hashlib.sha1("\n".join([folder, *sorted(paths)]).encode()).hexdigest()


def tree_page(commit: Commit, path: str, query: TreeQuery) -> tuple[list[dict[str, Any]], int | None] | None:
    """One page of `GET /api/models/{repo_id}/tree/{rev}/{path}`, or None when `path` is no folder."""
    prefix = f"{path.strip('/')}/" if path.strip("/") else ""
    below = [f for f in commit.files if f.path.startswith(prefix)]
    if prefix and not below:
        return None
    folders: dict[str, list[str]] = {}
    files = []
    for f in below:
        parts = f.path[len(prefix) :].split("/")
        depth = len(parts) if query.recursive else 1
        for i in range(1, min(depth, len(parts) - 1) + 1):
            folders.setdefault(prefix + "/".join(parts[:i]), []).append(f.path)
        if query.recursive or len(parts) == 1:
            files.append(f)
    last_commit = {"id": commit.sha, "title": "Upload files", "date": format_hub_date(commit.last_modified)}
    entries: list[dict[str, Any]] = []
    for folder, contained in sorted(folders.items()):
        entries.append({"type": "directory", "oid": _tree_oid(folder, contained), "size": 0, "path": folder})
    for f in sorted(files, key=lambda f: f.path):
        entry: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
        entries.append(entry)
    if query.expand:
        entries = [{**entry, "lastCommit": last_commit} for entry in entries]
    end = query.offset + query.page_size
    return entries[query.offset : end], (end if end < len(entries) else None)
