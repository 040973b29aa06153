"""Downloading a Civitai file safely: Civitai's own hosts only, the token only to its API host, bytes capped,
the SHA256 its API gave checked before the file is kept.

Civitai's download endpoint (`/api/download/models/<version>`) answers with a redirect to a signed URL on its
storage (`b2.civitai.com`, or its Cloudflare R2 delivery worker), or, for a download that needs a login, a
redirect to its own `/login?...&reason=download-auth` (observed in the wild, and what ComfyUI clients key on).
Redirects are followed by hand, one hop at a time, so every hop is checked before anything is asked of it:
https (or http when the endpoint itself is, a local stand-in), to the endpoint's host or one of the allowed
hosts (`*.example.com` allows its sub-domains). The token goes in an `Authorization` header to the endpoint's
host only, never in a URL (URLs are logged by the HTTP client) and never to a storage host. httpx's own
redirect following is not used: it would ask each new host before we could look at it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2

from ..errors import (
    CivitaiUnavailableError,
    DownloadRefusedError,
    LoraNotFoundError,
    RestrictedLoraError,
)

__all__ = ["PARTIAL_PREFIX", "HostPolicy", "download_file", "stale_partial_after_s"]

logger = logging.getLogger(__name__)

_MAX_HOPS = 5
# Slack over the size the API announced: `sizeKB` is a float of kilobytes, not an exact byte count.
_SIZE_SLACK = 64 * 1024
# A download in progress is a file of this prefix beside its target; no finished file is ever named so.
PARTIAL_PREFIX = ".part-"


def stale_partial_after_s(timeout_s: float) -> float:
    """How long a partial file can go unwritten before no download writes it any more.

    `download_file` writes each piece as it arrives, and the HTTP client fails a read that waits more than
    `timeout_s` (the download then deletes its file), so a live download's file is never that old; ten
    timeouts, at least a minute, leave room for a process the OS or the GIL held back.
    """
    return max(60.0, 10 * timeout_s)


class HostPolicy:
    """Which hosts a download may go to, and which one may see the token (the endpoint's)."""

    def __init__(self, endpoint: str, allowed_hosts: Sequence[str] = ()) -> None:
        parts = urlsplit(endpoint)
        self.endpoint_host = (parts.hostname or "").lower()
        self.endpoint_port = parts.port
        self.insecure = parts.scheme == "http"
        self._exact = {h.lower().rstrip(".") for h in allowed_hosts if not h.startswith("*.")}
        self._suffixes = tuple(h[1:].lower().rstrip(".") for h in allowed_hosts if h.startswith("*."))

    def is_endpoint(self, url: str) -> bool:
        parts = urlsplit(url)
        return (parts.hostname or "").lower() == self.endpoint_host and parts.port == self.endpoint_port

    def refusal(self, url: str) -> str | None:
        """Why a download may not go to `url` (None when it may)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        if parts.scheme != "https" and not (parts.scheme == "http" and self.insecure):
            return f"its scheme is {parts.scheme or 'missing'}, not https"
        if parts.username or parts.password:
            return "it carries user info"
        if self.is_endpoint(url) or host in self._exact or any(host.endswith(s) for s in self._suffixes):
            return None
        return f"host {host or '(none)'!r} is neither {self.endpoint_host!r} nor in CIVITAI_ALLOWED_HOSTS"


def download_file(
    client: httpx2.Client,
    url: str,
    target: Path,
    *,
    policy: HostPolicy,
    token: str | None,
    sha256: str,
    size: int | None,
    max_bytes: int,
    label: str,
) -> Path:
    """Fetch `url` into `target` (written atomically, only once its SHA256 matched); returns `target`."""
    refused = policy.refusal(url)
    if refused is not None or not policy.is_endpoint(url):
        why = refused or f"it is not on {policy.endpoint_host!r}"
        raise DownloadRefusedError(f"Civitai's download link for {label} is not followed: {why}")
    cap = min(max_bytes, size + _SIZE_SLACK) if size is not None else max_bytes
    with _response(client, url, policy=policy, token=token, label=label) as response:
        announced = response.headers.get("content-length", "")
        if announced.isdigit() and int(announced) > cap:
            raise DownloadRefusedError(
                f"Civitai announced {int(announced)} bytes for {label}; accepted: at most {cap} (its API said "
                f"{size} bytes, MAX_ADAPTER_BYTES is {max_bytes})"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=PARTIAL_PREFIX, dir=target.parent)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                received = 0
                # Each piece as it arrives (no chunk size), flushed: the file's mtime shows the download alive.
                for chunk in response.iter_bytes():
                    received += len(chunk)
                    if received > cap:
                        raise DownloadRefusedError(
                            f"Civitai sent more than {cap} bytes for {label} (its API said {size}); nothing was kept"
                        )
                    digest.update(chunk)
                    out.write(chunk)
                    out.flush()
            if digest.hexdigest() != sha256:
                raise DownloadRefusedError(
                    f"the file Civitai sent for {label} has SHA256 {digest.hexdigest()[:16]}…, not the "
                    f"{sha256[:16]}… its API gave; nothing was kept"
                )
            os.replace(temp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    logger.info("downloaded %s from Civitai: %d bytes, SHA256 checked", label, received)
    return target


@contextlib.contextmanager
def _response(
    client: httpx2.Client, url: str, *, policy: HostPolicy, token: str | None, label: str
) -> Iterator[httpx2.Response]:
    """The final answer's stream, after following redirects hop by hop under `policy`."""
    for _ in range(_MAX_HOPS + 1):
        headers = {"Authorization": f"Bearer {token}"} if token and policy.is_endpoint(url) else {}
        try:
            with client.stream("GET", url, headers=headers, follow_redirects=False) as response:
                if response.is_redirect:
                    url = _next_hop(url, response, policy, label, token is not None)
                    continue
                _check_status(response, label, token is not None)
                yield response
                return
        except httpx2.TimeoutException as e:
            raise CivitaiUnavailableError(f"Civitai did not answer in time while downloading {label}") from e
        except httpx2.HTTPError as e:
            # The message is httpx's (it names the host, never our headers).
            raise CivitaiUnavailableError(f"Civitai could not be reached while downloading {label}: {e}") from e
    raise DownloadRefusedError(f"Civitai redirected the download of {label} more than {_MAX_HOPS} times")


def _next_hop(url: str, response: httpx2.Response, policy: HostPolicy, label: str, has_token: bool) -> str:
    location = response.headers.get("location", "")
    if not location:
        raise CivitaiUnavailableError(f"Civitai answered a redirect without a Location while downloading {label}")
    target = urljoin(url, location)
    parts = urlsplit(target)
    if policy.is_endpoint(target) and (
        parts.path.rstrip("/").endswith("/login") or "download-auth" in parse_qs(parts.query).get("reason", [])
    ):
        raise RestrictedLoraError(_login_needed(label, has_token))
    refused = policy.refusal(target)
    if refused is not None:
        logger.warning("refused a Civitai redirect for %s: %s", label, refused)
        raise DownloadRefusedError(
            f"Civitai redirected the download of {label} where this Space does not go: {refused}"
        )
    return target


def _check_status(response: httpx2.Response, label: str, has_token: bool) -> None:
    status = response.status_code
    if status < 400:
        return
    response.read()
    if status in (401, 403):
        raise RestrictedLoraError(_login_needed(label, has_token, status))
    if status == 404:
        raise LoraNotFoundError(f"Civitai has no file to download for {label} (HTTP 404)")
    raise CivitaiUnavailableError(f"Civitai answered HTTP {status} while downloading {label}")


def _login_needed(label: str, has_token: bool, status: int | None = None) -> str:
    answered = f" (HTTP {status})" if status else ""
    if has_token:
        return (
            f"Civitai refused the download of {label}{answered}: the configured CIVITAI_TOKEN has no access to it "
            "(early access, or a creator's restriction); accepted: LoRAs anyone may download"
        )
    return (
        f"Civitai requires a login to download {label}{answered} (its creator asks for one, or it is in early "
        "access); accepted: LoRAs downloadable without one, or set CIVITAI_TOKEN to a Civitai API key"
    )
