"""A local stand-in for Civitai's public REST API and downloads, for `CIVITAI_ENDPOINT` in tests.

It answers the shapes of developer.civitai.com's reference (and civitai/civitai's handlers):
`GET /api/v1/model-versions/{id}`, `GET /api/v1/models/{id}` (published versions only), `GET /api/v1/models`
(the listing, filtered by `types` and `baseModels`, sorted by downloads), and `GET /api/download/models/{id}`,
which behaves as each version's `download` says:

- ``"redirect"`` (default): a 307 to `/storage/<version>/<file>` on `storage_host` (another name for this same
  server, e.g. `localhost` where the endpoint is `127.0.0.1`: a second host, as Civitai's storage is);
- ``"direct"``: the bytes themselves;
- ``"elsewhere"``: a 307 to a host outside any allow-list (nothing listens there);
- ``"login"``: a 307 to `/login?returnUrl=...&reason=download-auth`, as Civitai answers a signed-out download
  that needs a login;
- ``"401"`` / ``"403"``: that status;
- ``"tampered"``: other bytes than the hashed ones (a SHA256 mismatch).

Every request is logged with its Host and Authorization headers (kept out of reprs).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

__all__ = ["MISSING", "CivitaiRequest", "StandInCivitai"]

# `nsfw_level=MISSING`: the version's JSON has no `nsfwLevel` key at all.
MISSING: Any = object()
DOWNLOADS = ("redirect", "direct", "elsewhere", "login", "401", "403", "tampered")


@dataclass(frozen=True)
class CivitaiRequest:
    path: str
    query: dict[str, list[str]]
    host: str
    # Kept out of repr so a failing assertion never prints a token.
    authorization: str | None = field(repr=False)


@dataclass
class _Version:
    document: dict[str, Any]
    data: bytes
    download: str
    # Further model files of the version by name (a high/low-noise pair's other half), each downloaded on its own.
    more: dict[str, bytes] = field(default_factory=dict)

    def data_of(self, name: str | None) -> bytes:
        return self.more.get(name or "", self.data)


class StandInCivitai:
    """A threaded HTTP server on 127.0.0.1; `storage_host` names the same server as Civitai's storage host."""

    def __init__(self, *, storage_host: str = "localhost") -> None:
        self.storage_host = storage_host
        self._versions: dict[int, _Version] = {}
        self._models: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._requests: list[CivitaiRequest] = []
        # When set, every `/api/v1/...` call answers this status (a Civitai outage, 5xx).
        self.api_status: int | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[CivitaiRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def start(self) -> None:
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                app._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="standin-civitai", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- content ------------------------------------------------------------------------------------

    def add_lora(
        self,
        version_id: int,
        data: bytes,
        *,
        model_id: int | None = None,
        name: str = "style.safetensors",
        base_model: str = "SDXL 1.0",
        model_type: str = "LORA",
        model_name: str | None = None,
        nsfw: bool = False,
        nsfw_level: object = 1,
        trained_words: Sequence[str] = ("civstyle",),
        availability: str = "Public",
        early_access_ends: str | None = None,
        download: str = "redirect",
        extra_files: Sequence[Mapping[str, Any]] = (),
        published_at: str = "2025-01-01T00:00:00.000Z",
        downloads: int = 10,
        clip_skip: int | None = None,
        settings: Mapping[str, Any] | None = None,
        images: Sequence[Mapping[str, Any]] = (),
        more: Mapping[str, bytes] | None = None,
    ) -> dict[str, Any]:
        """Publish one version (of model `model_id`, default `version_id * 10`) serving `data`; returns its JSON."""
        if download not in DOWNLOADS:
            raise ValueError(f"download={download!r}; accepted: {', '.join(DOWNLOADS)}")
        model_id = model_id or version_id * 10
        file = {
            "id": version_id * 100,
            "name": name,
            "type": "Model",
            "sizeKB": len(data) / 1024,
            "metadata": {"format": "SafeTensor", "size": None, "fp": "fp16"},
            "pickleScanResult": "Success",
            "virusScanResult": "Success",
            "hashes": {"SHA256": hashlib.sha256(data).hexdigest().upper(), "AutoV2": "0123456789"},
            "downloadUrl": f"{self.url}/api/download/models/{version_id}",
            "primary": True,
        }
        model = {"name": model_name or f"Model {model_id}", "type": model_type, "nsfw": nsfw, "poi": False}
        document: dict[str, Any] = {
            "id": version_id,
            "modelId": model_id,
            "name": f"v{version_id}",
            "baseModel": base_model,
            "baseModelType": "Standard",
            "air": f"urn:air:sdxl:lora:civitai:{model_id}@{version_id}",
            "status": "Published",
            "availability": availability,
            "nsfwLevel": nsfw_level,
            "publishedAt": published_at,
            "trainedWords": list(trained_words),
            "earlyAccessEndsAt": early_access_ends,
            "stats": {"downloadCount": downloads, "thumbsUpCount": 3},
            "model": model,
            "files": [*extra_files, *self._more_files(version_id, more or {}), file],
            "images": list(images),
            "downloadUrl": f"{self.url}/api/download/models/{version_id}",
        }
        if nsfw_level is MISSING:
            del document["nsfwLevel"]
        if clip_skip is not None:
            document["clipSkip"] = clip_skip
        if settings is not None:
            document["settings"] = dict(settings)
        with self._lock:
            self._versions[version_id] = _Version(document, data, download, dict(more or {}))
            entry = self._models.setdefault(
                model_id, {"id": model_id, "name": model["name"], "type": model_type, "nsfw": nsfw, "versions": []}
            )
            entry["versions"].append(version_id)
        return document

    def _more_files(self, version_id: int, more: Mapping[str, bytes]) -> list[dict[str, Any]]:
        """Further model files, not primary, each with its own download URL (`?file=<name>`)."""
        return [
            {
                "id": version_id * 100 + index,
                "name": name,
                "type": "Model",
                "sizeKB": len(data) / 1024,
                "metadata": {"format": "SafeTensor", "size": None, "fp": "fp16"},
                "hashes": {"SHA256": hashlib.sha256(data).hexdigest().upper()},
                "downloadUrl": f"{self.url}/api/download/models/{version_id}?file={name}",
                "primary": False,
            }
            for index, (name, data) in enumerate(more.items(), start=1)
        ]

    def remove(self, version_id: int) -> None:
        """Unpublish a version (its API answers 404 from now on)."""
        with self._lock:
            self._versions[version_id].document["status"] = "Unpublished"

    def set_download(self, version_id: int, download: str) -> None:
        with self._lock:
            self._versions[version_id].download = download

    # -- HTTP ---------------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query)
        with self._lock:
            self._requests.append(
                CivitaiRequest(parts.path, query, handler.headers.get("Host", ""), handler.headers.get("Authorization"))
            )
        segments = [s for s in parts.path.split("/") if s]
        status, headers, body = 404, {"Content-Type": "application/json"}, json.dumps({"error": "Not found"}).encode()
        if self.api_status is not None and segments[:2] == ["api", "v1"]:
            status, body = self.api_status, json.dumps({"error": "outage"}).encode()
        elif segments[:3] == ["api", "v1", "model-versions"] and len(segments) == 4 and segments[3].isdigit():
            found = self._version(int(segments[3]))
            if found is not None and found.document["status"] == "Published":
                status, body = 200, json.dumps(found.document).encode()
        elif segments[:3] == ["api", "v1", "models"] and len(segments) == 4 and segments[3].isdigit():
            model = self._model(int(segments[3]))
            if model is not None:
                status, body = 200, json.dumps(model).encode()
        elif segments == ["api", "v1", "models"]:
            status, body = 200, json.dumps(self._listing(query)).encode()
        elif segments[:3] == ["api", "download", "models"] and len(segments) == 4 and segments[3].isdigit():
            status, headers, body = self._download(int(segments[3]), (query.get("file") or [None])[0])
        elif segments[:1] == ["storage"] and len(segments) == 3 and segments[1].isdigit():
            found = self._version(int(segments[1]))
            if found is not None:
                status, headers, body = 200, {"Content-Type": "application/octet-stream"}, found.data_of(segments[2])
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _version(self, version_id: int) -> _Version | None:
        with self._lock:
            return self._versions.get(version_id)

    def _model(self, model_id: int) -> dict[str, Any] | None:
        with self._lock:
            model = self._models.get(model_id)
            if model is None:
                return None
            versions = [self._versions[v].document for v in model["versions"]]
        published = [{k: v for k, v in d.items() if k != "model"} for d in versions if d["status"] == "Published"]
        return {k: v for k, v in model.items() if k != "versions"} | {"modelVersions": published}

    def _listing(self, query: dict[str, list[str]]) -> dict[str, Any]:
        types = set(",".join(query.get("types", [])).split(",")) - {""}
        bases = set(query.get("baseModels", []))
        with self._lock:
            ids = list(self._models)
        items = []
        for model_id in ids:
            model = self._model(model_id)
            if model is None or (types and model["type"] not in types):
                continue
            if bases and not any(v["baseModel"] in bases for v in model["modelVersions"]):
                continue
            downloads = sum(v["stats"]["downloadCount"] for v in model["modelVersions"])
            items.append(model | {"stats": {"downloadCount": downloads}})
        items.sort(key=lambda m: -m["stats"]["downloadCount"])
        return {"items": items, "metadata": {"totalItems": len(items)}}

    def _download(self, version_id: int, file: str | None = None) -> tuple[int, dict[str, str], bytes]:
        found = self._version(version_id)
        if found is None:
            return 404, {"Content-Type": "application/json"}, b'{"error": "Not found"}'
        name = file if file in found.more else found.document["files"][-1]["name"]
        here = f"http://{self.storage_host}:{self.port}"
        redirects = {
            "redirect": f"{here}/storage/{version_id}/{name}",
            "elsewhere": f"http://files.example.invalid:{self.port}/storage/{version_id}/{name}",
            "login": f"/login?returnUrl=%2Fmodel-versions%2F{version_id}&reason=download-auth",
        }
        if found.download in redirects:
            return 307, {"Location": redirects[found.download]}, b""
        if found.download in ("401", "403"):
            return int(found.download), {"Content-Type": "application/json"}, b'{"error": "Unauthorized"}'
        data = found.data_of(name) if found.download == "direct" else bytes(reversed(found.data_of(name)))
        return 200, {"Content-Type": "application/octet-stream"}, data
