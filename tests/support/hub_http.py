"""The stand-in Hub's HTTP side: routing, the Hub's error protocol, file serving with ranges, and faults."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from .hub_models import (
    BadQuery,
    encode_cursor,
    list_page,
    model_document,
    parse_expand,
    parse_list_query,
    parse_tree_query,
    tree_page,
)
from .hub_store import RepoRecord, RepoStore

__all__ = ["FAULTS", "Fault", "HubApp", "HubServer", "LoggedRequest", "Reply"]

logger = logging.getLogger(__name__)

FAULTS = ("down", "error500", "slow", "malformed_json", "truncate")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
_REPO_SUBROUTES = ("revision", "tree")


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the stand-in Hub received it. `path` is percent-decoded, header names are lower-case."""

    method: str
    path: str
    query: dict[str, list[str]]
    # Kept out of repr so a failing assertion never prints a token.
    headers: dict[str, str] = field(repr=False)


@dataclass(frozen=True)
class Fault:
    kind: str | None
    delay_s: float = 0.0
    paths: str | None = None

    def applies_to(self, path: str) -> bool:
        return self.kind is not None and (self.paths is None or self.paths in path)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    is_file: bool = False  # a file's bytes (the "truncate" fault cuts only these)
    truncate: bool = False  # send the full Content-Length but only half the body, then hang up


def _json_reply(status: int, payload: Any, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    body = json.dumps(payload).encode()
    return Reply(status, (("Content-Type", "application/json; charset=utf-8"), *headers), body)


def _error(status: int, message: str, code: str | None = None, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    """The Hub's error protocol: the client classifies errors by X-Error-Code and shows X-Error-Message."""
    extra = (("X-Error-Code", code),) if code else ()
    # Header values go out as latin-1: a revision or path from the URL may hold anything.
    header_message = message.encode("ascii", "replace").decode()
    return _json_reply(status, {"error": message}, (*extra, ("X-Error-Message", header_message), *headers))


def _split_repo(parts: Sequence[str], store: RepoStore) -> tuple[str, list[str]] | None:
    """`owner/name/<rest>` or `name/<rest>`: prefer a reading that names an existing repo, then the 2-part one."""
    readings: list[tuple[str, list[str]]] = []
    for n in (2, 1):
        tail = list(parts[n:])
        if len(parts) >= n and (not tail or (tail[0] in _REPO_SUBROUTES and len(tail) >= 2) or tail == ["refs"]):
            readings.append(("/".join(parts[:n]), tail))
    existing = [r for r in readings if store.get(r[0]) is not None]
    if existing:
        return existing[0]
    return readings[0] if readings else None


def _byte_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """(start, end inclusive) for a single satisfiable range; None to send everything; "unsatisfiable"."""
    match = _RANGE.match(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None  # absent, multi-range or malformed: RFC 9110 lets a server ignore it
    first, last = match.groups()
    if first == "":
        length = int(last)
        return (max(size - length, 0), size - 1) if length and size else "unsatisfiable"
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return "unsatisfiable"
    return start, end


class HubApp:
    """Everything but the sockets: turns (method, target, headers) into a Reply, honouring the current fault."""

    def __init__(self, store: RepoStore, *, token: str | None, page_size: int) -> None:
        self.store = store
        self.token = token
        self.page_size = page_size
        self.base_url = ""
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[LoggedRequest] = []
        self._fault = Fault(None)
        self._download_delays: dict[str, float] = {}

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def set_fault(self, fault: Fault) -> None:
        with self._lock:
            self._fault = fault

    def set_download_delay(self, repo_id: str, seconds: float) -> None:
        with self._lock:
            self._download_delays[f"/{repo_id}/resolve/"] = seconds

    def handle(self, method: str, target: str, headers: Mapping[str, str]) -> Reply | None:
        """The reply to send, or None to hang up without answering."""
        split = urlsplit(target)
        path = unquote(split.path)
        query = parse_qs(split.query, keep_blank_values=True)
        with self._lock:
            self._requests.append(LoggedRequest(method, path, query, dict(headers)))
            fault = self._fault
            # A whole-file download (no Range: header reads and resumes are small) takes its repo's time.
            delay = 0.0
            if method == "GET" and "range" not in headers:
                delay = next((d for prefix, d in self._download_delays.items() if path.startswith(prefix)), 0.0)
        if delay > 0 and self.stopping.wait(delay):
            return None
        if fault.applies_to(path):
            if fault.delay_s > 0 and self.stopping.wait(fault.delay_s):
                return None
            if fault.kind == "down":
                return None
            if fault.kind == "error500":
                return _error(500, "Internal Error - We're working hard to fix this as soon as possible!")
            if fault.kind == "malformed_json" and path.startswith("/api/"):
                return Reply(200, (("Content-Type", "application/json; charset=utf-8"),), b'{"id": "half-a-docum')
        reply = self._route(method, split.path, query, headers)
        if fault.applies_to(path) and fault.kind == "truncate" and method == "GET" and reply.is_file:
            return Reply(reply.status, reply.headers, reply.body, is_file=True, truncate=True)
        return reply

    def _route(self, method: str, raw_path: str, query: dict[str, list[str]], headers: Mapping[str, str]) -> Reply:
        auth = headers.get("authorization")
        authorized = self.token is not None and auth == f"Bearer {self.token}"
        if auth is not None and not authorized:
            return _error(401, _INVALID_CREDENTIALS)
        parts = [unquote(p) for p in raw_path.split("/")[1:]]
        is_read = method in ("GET", "HEAD")
        try:
            if parts[:2] == ["api", "models"] and is_read:
                if len(parts) == 2 or parts[2:] == [""]:
                    return self._list_models(query, authorized)
                split = _split_repo(parts[2:], self.store)
                if split is not None:
                    return self._repo_api(*split, query, authorized)
            elif is_read and "resolve" in parts[1:3]:
                at = 2 if len(parts) > 4 and parts[2] == "resolve" else 1
                if len(parts) > at + 2:
                    repo_id, revision, path = "/".join(parts[:at]), parts[at + 1], "/".join(parts[at + 2 :])
                    return self._resolve(repo_id, revision, path, headers.get("range"), authorized)
        except BadQuery as e:
            return _error(400, str(e))
        if not is_read:
            return _error(405, f"{method} is not served by the stand-in Hub; only GET and HEAD are")
        return _error(404, "Sorry, we can't find the page you are looking for.")

    def _visible_repo(self, repo_id: str, authorized: bool) -> RepoRecord | Reply:
        repo = self.store.get(repo_id)
        if repo is None:
            return _error(404, "Repository not found", "RepoNotFound")
        if repo.private and not authorized:
            # The Hub does not reveal that a private repo exists.
            return _error(401, "Repository not found", "RepoNotFound")
        return repo

    def _list_models(self, query: dict[str, list[str]], authorized: bool) -> Reply:
        parsed = parse_list_query(query, default_page_size=self.page_size)
        repos = [r for r in self.store.all() if authorized or not r.private]
        page, next_offset = list_page(repos, parsed)
        headers: tuple[tuple[str, str], ...] = ()
        if next_offset is not None:
            params = [(k, v) for k, values in query.items() if k != "cursor" for v in values]
            next_url = f"{self.base_url}/api/models?{urlencode([*params, ('cursor', encode_cursor(next_offset))])}"
            headers = (("Link", f'<{next_url}>; rel="next"'),)
        return _json_reply(200, page, headers)

    def _repo_api(self, repo_id: str, tail: list[str], query: dict[str, list[str]], authorized: bool) -> Reply:
        repo = self._visible_repo(repo_id, authorized)
        if isinstance(repo, Reply):
            return repo
        if tail == ["refs"]:
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha} for b, sha in repo.branches.items()]
            return _json_reply(200, {"branches": branches, "converts": [], "tags": []})
        describe = not tail or tail[0] == "revision"
        revision = ("/".join(tail[1:]) or repo.default_branch) if describe else tail[1]
        commit = repo.resolve(revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        if describe:
            blobs = query.get("blobs", ["false"])[-1] in ("1", "true", "True")
            return _json_reply(200, model_document(repo, commit, expand=parse_expand(query), blobs=blobs))
        tree_query = parse_tree_query(query, default_page_size=self.page_size)
        path = "/".join(tail[2:])
        result = tree_page(commit, path, tree_query)
        if result is None:
            return _error(404, f"Entry not found: {path}", "EntryNotFound", (("X-Repo-Commit", commit.sha),))
        page, next_offset = result
        headers: tuple[tuple[str, str], ...] = ()
        if next_offset is not None:
            params = [(k, v) for k, values in query.items() if k != "cursor" for v in values]
            url = f"{self.base_url}/api/models/{repo_id}/tree/{commit.sha}/{path}".rstrip("/")
            headers = (("Link", f'<{url}?{urlencode([*params, ("cursor", encode_cursor(next_offset))])}>; rel="next"'),)
        return _json_reply(200, page, headers)

    def _resolve(self, repo_id: str, revision: str, path: str, range_header: str | None, authorized: bool) -> Reply:
        repo = self._visible_repo(repo_id, authorized)
        if isinstance(repo, Reply):
            return repo
        if repo.gated:
            message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return _error(401, message, "GatedRepo")
        commit = repo.resolve(revision)
        if commit is None:
            return _error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        stored = commit.file(path)
        if stored is None:
            return _error(404, "Entry not found", "EntryNotFound", (("X-Repo-Commit", commit.sha),))
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("ETag", f'"{stored.etag}"'),
            ("X-Repo-Commit", commit.sha),
            ("Accept-Ranges", "bytes"),
        ]
        if stored.lfs:
            headers += [("X-Linked-Etag", f'"{stored.sha256}"'), ("X-Linked-Size", str(stored.size))]
        wanted = _byte_range(range_header, stored.size)
        if wanted == "unsatisfiable":
            return Reply(416, (*headers, ("Content-Range", f"bytes */{stored.size}")))
        content = self.store.read(repo_id, commit.sha, path)
        if wanted is None:
            return Reply(200, tuple(headers), content, is_file=True)
        start, end = wanted
        ranged = (*headers, ("Content-Range", f"bytes {start}-{end}/{stored.size}"))
        return Reply(206, ranged, content[start : end + 1], is_file=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "StandInHub/1.0"
    server: HubServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        reply = self.server.app.handle(method, self.path, {k.lower(): v for k, v in self.headers.items()})
        self.close_connection = True
        if reply is None:
            return
        body = reply.body if method != "HEAD" else b""
        try:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if reply.truncate else body)
        except (BrokenPipeError, ConnectionResetError) as e:
            # Expected when a client gave up first (timeouts in the "slow" fault).
            logger.debug("stand-in Hub: client went away during %s %s: %s", method, self.path, e)

    def log_message(self, format: str, *args: Any) -> None:
        # Request line and status only: headers (and the token in them) never reach the log.
        logger.debug("stand-in Hub: " + format, *args)


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # handlers finish on their own; waiting on a stalled client would hang stop()
    request_queue_size = 64  # the client fetches shards from a thread pool: bursts must not be refused

    def __init__(self, address: tuple[str, int], app: HubApp) -> None:
        self.app = app
        super().__init__(address, _Handler)
