"""A local stand-in for the Hugging Face Hub that the real `huggingface_hub` client can talk to.

Point the client at it with `HF_ENDPOINT=<hub.url>` set before `huggingface_hub` is imported (the client reads it
once, at import), and `HF_HUB_DISABLE_XET=1`. The Hub's model API is covered as far as listing, model info, trees,
refs and file downloads go (see `tests/support/hub_http.py` for the routes), with the real Hub's error protocol.

    with StandInHub(tmp_path) as hub:
        sha = hub.add_repo("alice/pixel-lora", {"README.md": card, "pixel.safetensors": weights}, tags=["lora"])
        HfApi().model_info("alice/pixel-lora").sha == sha

Faults for reliability tests (`set_fault`), each limited to request paths containing `paths` when given:

- ``"down"``: the connection is closed without an answer;
- ``"error500"``: HTTP 500 with the Hub's error headers;
- ``"slow"``: answers normally after `delay_s` seconds (`delay_s` delays the other faults too);
- ``"malformed_json"``: `/api/...` answers 200 with a body that is not JSON;
- ``"truncate"``: file downloads announce the full Content-Length, send half the bytes, then hang up.
  `hf_hub_download` keeps what it read only in 10 MB chunks, so for smaller files it retries from scratch
  5 times (sleeping 1 s before each) and then raises `httpx2.RemoteProtocolError`; bigger files resume with
  Range requests, which are cut in half again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from .hub_http import FAULTS, Fault, HubApp, HubServer, LoggedRequest
from .hub_store import HubSetupError, RepoStore

__all__ = ["FAULTS", "HubSetupError", "LoggedRequest", "StandInHub"]

logger = logging.getLogger(__name__)

_HUB_PAGE_SIZE = 1000


class StandInHub:
    """A threaded HTTP server on 127.0.0.1 serving repos kept under `root`.

    `token`: when set, requests carrying `Authorization: Bearer <token>` see private repos; any other
    Authorization header is refused with 401 like the Hub refuses an invalid token.
    `page_size`: entries per page of `/api/models` when the caller gives no `limit`, and of trees.
    """

    def __init__(
        self,
        root: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        page_size: int = _HUB_PAGE_SIZE,
    ) -> None:
        if host != "127.0.0.1":
            raise HubSetupError(f"host={host!r} is not accepted: the stand-in Hub listens on 127.0.0.1 only")
        if page_size < 1:
            raise HubSetupError(f"page_size={page_size} must be at least 1")
        self.root = Path(root)
        self._host = host
        self._port = port
        self._store = RepoStore(self.root)
        self._app = HubApp(self._store, token=token, page_size=page_size)
        self._server: HubServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is not None:
            return f"http://{self._host}:{self._server.server_address[1]}"
        if self._port:
            return f"http://{self._host}:{self._port}"
        raise RuntimeError("the stand-in Hub has no URL before start() when port=0: the port is chosen when it binds")

    @property
    def requests(self) -> list[LoggedRequest]:
        """A snapshot of every request received since start (or the last clear_requests), oldest first."""
        return self._app.requests

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError(f"the stand-in Hub is already serving at {self.url}")
        self._app.stopping.clear()
        self._server = HubServer((self._host, self._port), self._app)
        self._app.base_url = self.url
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="standin-hub", daemon=True
        )
        self._thread.start()
        logger.info("stand-in Hub serving %s from %s", self.url, self.root)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        # Wake handlers sleeping in the "slow" fault first, so none outlives the server.
        self._app.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()
        self._server = self._thread = None
        logger.info("stand-in Hub stopped")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        tags: Sequence[str] = (),
        downloads: int = 0,
        likes: int = 0,
        trending_score: int = 0,
        created_at: datetime | None = None,
        last_modified: datetime | None = None,
        gated: bool | str = False,
        private: bool = False,
        revision: str = "main",
        card_data_override: Mapping[str, Any] | None = None,
    ) -> str:
        """Commit `files` as branch `revision` of model repo `repo_id`; returns the commit's 40-hex sha.

        Card data comes from README.md's YAML front matter unless `card_data_override` replaces it (to serve
        cards the Hub would hold but YAML cannot express cleanly). The repo-level attributes (stats, gated,
        private) are those of the latest call; `created_at` defaults to the first commit's date. Adding the same
        branch again makes a new commit for it (the old sha stays resolvable, as in git).
        """
        return self._store.add_repo(
            repo_id,
            files,
            tags=tags,
            downloads=downloads,
            likes=likes,
            trending_score=trending_score,
            created_at=created_at,
            last_modified=last_modified,
            gated=gated,
            private=private,
            revision=revision,
            card_data_override=card_data_override,
        )

    def repo_dir(self, repo_id: str) -> Path:
        """Where `repo_id` lives under root: `meta.json` and `commits/<sha>/<files>`."""
        return self._store.repo_dir(repo_id)

    def file_url(self, repo_id: str, path: str, revision: str = "main") -> str:
        """The resolve URL, quoted the way `huggingface_hub.hf_hub_url` quotes it."""
        return f"{self.url}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    def clear_requests(self) -> None:
        self._app.clear_requests()

    def set_download_delay(self, repo_id: str, seconds: float) -> None:
        """Make every whole-file download from `repo_id` take `seconds` more (a link's throughput, for
        benchmarks); Range requests (header reads) are not delayed."""
        if seconds < 0:
            raise HubSetupError(f"seconds={seconds} must not be negative")
        self._app.set_download_delay(repo_id, seconds)

    def set_fault(self, fault: str | None, *, delay_s: float = 0.0, paths: str | None = None) -> None:
        """Misbehave from now on (see the module doc); `None` restores normal service."""
        if fault is not None and fault not in FAULTS:
            raise HubSetupError(f"fault {fault!r} is not known; accepted: None or one of {', '.join(FAULTS)}")
        if delay_s < 0:
            raise HubSetupError(f"delay_s={delay_s} must not be negative")
        self._app.set_fault(Fault(fault, delay_s, paths))
