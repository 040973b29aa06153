"""`CivitaiSource`: Civitai's public REST API as a second LoRA source, at `CIVITAI_ENDPOINT` only.

A reference is resolved to one model version through the API; answers are cached stale-while-revalidate
(`lora_catalog.swr`), and the policy (`versions.check_version`) is applied on every use, so a cached answer is
judged like a new one. Files come from `download.download_file` (Civitai's hosts only, SHA256 checked). The
token (`CIVITAI_TOKEN`) goes in a header to the endpoint's host only, never in a URL, log line or error.
The API calls made: docs/internals.md, "lora_catalog/civitai/source.py".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from ..entries import LoraEntry
from ..errors import (
    CatalogError,
    CivitaiUnavailableError,
    InvalidRequestError,
    LoraNotFoundError,
    RestrictedLoraError,
)
from ..pairs import choose_pair
from ..swr import StaleWhileRevalidate
from .bases import CivitaiBase, civitai_base
from .download import HostPolicy, download_file
from .refs import CivitaiRef, parse_civitai
from .versions import (
    CivitaiFile,
    CivitaiVersion,
    NsfwLevel,
    check_version,
    describe_file,
    latest_version_id,
    model_files,
    parse_version,
)

__all__ = ["DEFAULT_ENDPOINT", "CivitaiSource", "ResolvedVersion"]

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://civitai.com"
_USER_AGENT = "lora-switchboard/0.1.0"
_MAX_LIST = 100  # the API's own page limit for /models


@dataclass(frozen=True)
class ResolvedVersion:
    """A version that passed the policy, and the file of it this Space downloads."""

    version: CivitaiVersion
    file: CivitaiFile
    # A pair's low-noise file, `file` being its high-noise one (`lora_catalog.pairs`); None: one file.
    pair: CivitaiFile | None = None


class CivitaiSource:
    """Civitai (or a stand-in at `endpoint`) as a LoRA source; thread-safe."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        token: str | None = None,
        timeout_s: float = 10.0,
        *,
        max_nsfw: NsfwLevel = NsfwLevel.PG13,
        allowed_hosts: Sequence[str] = (),
        cache_ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not timeout_s > 0:
            raise InvalidRequestError(f"timeout_s={timeout_s!r} is not accepted; accepted: a number above 0")
        self.endpoint = endpoint.rstrip("/")
        self.max_nsfw = max_nsfw
        self._token = token or None
        self._policy = HostPolicy(self.endpoint, allowed_hosts)
        self._client = httpx2.Client(timeout=timeout_s, headers={"User-Agent": _USER_AGENT})
        self._versions: StaleWhileRevalidate[int, CivitaiVersion] = StaleWhileRevalidate(
            self._lookup_version, ttl_s=cache_ttl_s, name="civitai", unavailable=CivitaiUnavailableError, clock=clock
        )
        self._latest: StaleWhileRevalidate[int, int] = StaleWhileRevalidate(
            self._lookup_latest, ttl_s=cache_ttl_s, name="civitai", unavailable=CivitaiUnavailableError, clock=clock
        )

    # -- resolving ---------------------------------------------------------------------------------

    def resolve(self, ref: str | CivitaiRef) -> ResolvedVersion:
        """The version `ref` names (the model's latest published one when it names none), checked by the policy."""
        parsed = ref if isinstance(ref, CivitaiRef) else parse_civitai(ref)
        if parsed is None:
            raise InvalidRequestError(f"{ref!r} is not a Civitai reference")
        version_id = parsed.version_id or self._latest.get(parsed.model_id or 0)
        version = self._versions.get(version_id)
        label = f"Civitai {version.ref!r} ({version.title})"
        # A version of a two-stage base (Wan 2.2 A14B) whose .safetensors model files are exactly a high- and a
        # low-noise one is one LoRA of both (whichever is primary); the policy is checked on it as on any version.
        # On any other base such names are no stages: the version is the single LoRA its primary file is.
        files = {_text_name(f): f for f in model_files(version.files)}
        base = civitai_base(version.base_model)
        pair = choose_pair(label, tuple(files), None) if base is not None and base.two_stage else None
        if pair is None:
            return ResolvedVersion(version, check_version(version, self.max_nsfw))
        high = check_version(dataclasses.replace(version, files=(files[pair[0]],)), self.max_nsfw)
        return ResolvedVersion(version, high, describe_file(files[pair[1]], label))

    def entry(self, ref: str | CivitaiRef) -> LoraEntry:
        """The catalogue entry for `ref` (the UI's card and `/lora_info`), after the same policy as a download."""
        resolved = self.resolve(ref)
        return resolved.version.entry(self.endpoint, self.max_nsfw, resolved.file)

    def stale_warning(self, ref: str | CivitaiRef) -> str | None:
        """Why the cached answer for `ref` is not fresh, or None when it is (or is not cached)."""
        parsed = ref if isinstance(ref, CivitaiRef) else parse_civitai(ref)
        if parsed is None:
            return None
        stale = [
            s
            for s in (
                self._latest.stale(parsed.model_id) if parsed.version_id is None and parsed.model_id else None,
                self._versions.stale(parsed.version_id) if parsed.version_id else None,
            )
            if s is not None
        ]
        if not stale:
            return None
        oldest = max(stale, key=lambda s: s.age_s)
        failure = next((s.failure for s in stale if s.failure), None)
        why = f"Civitai could not be reached ({failure})" if failure else "it is being revalidated"
        age = f"{oldest.age_s / 60:.0f} min"
        return f"Civitai LoRA {parsed.canonical!r} is served from Civitai metadata {age} old: {why}"

    def download(
        self, resolved: ResolvedVersion, folder: Path, *, max_bytes: int, file: CivitaiFile | None = None
    ) -> Path:
        """The version's file (or `file` of it: a pair's other) downloaded into `folder`, kept only when its SHA256
        matched the API's."""
        version, file = resolved.version, file or resolved.file
        return download_file(
            self._client,
            file.download_url,
            folder / file.name,
            policy=self._policy,
            token=self._token,
            sha256=file.sha256,
            size=file.size,
            max_bytes=max_bytes,
            label=f"Civitai LoRA {version.ref!r} ({file.name})",
        )

    # -- the catalogue tab ---------------------------------------------------------------------------

    def list_loras(
        self,
        bases: Sequence[CivitaiBase],
        *,
        search: str | None = None,
        sort: str = "Most Downloaded",
        period: str = "AllTime",
        limit: int = 100,
    ) -> list[LoraEntry]:
        """Up to `limit` LoRAs for Civitai's base models `bases`, in Civitai's order for `sort` (its own names:
        "Most Downloaded", "Highest Rated", "Newest"), the policy applied: a model none of whose versions for
        those bases passes it is left out."""
        params: list[tuple[str, str]] = [
            ("types", "LORA"),
            *(("baseModels", base.label) for base in bases),
            ("sort", sort),
            ("period", period),
            ("limit", str(min(limit, _MAX_LIST))),
            ("nsfw", "true" if self.max_nsfw >= NsfwLevel.R else "false"),
            ("primaryFileOnly", "true"),
        ]
        if search:
            params.append(("query", search))
        labels = {base.label for base in bases}
        where = f"the LoRA listing for {', '.join(sorted(labels))}"
        page = self._get_json("/api/v1/models", params, where)
        items = page.get("items") if isinstance(page, dict) else None
        if not isinstance(items, list):
            raise CivitaiUnavailableError(f"Civitai answered {where} without items")
        entries = [entry for item in items if (entry := self._listed_entry(item, labels)) is not None]
        return entries[:limit]

    def close(self) -> None:
        self._versions.close()
        self._latest.close()
        self._client.close()

    # -- the API -------------------------------------------------------------------------------------

    def _lookup_version(self, version_id: int) -> CivitaiVersion:
        where = f"model version {version_id}"
        return parse_version(self._get_json(f"/api/v1/model-versions/{version_id}", (), where), where)

    def _lookup_latest(self, model_id: int) -> int:
        where = f"model {model_id}"
        return latest_version_id(self._get_json(f"/api/v1/models/{model_id}", (), where), f"Civitai {where}")

    def _listed_entry(self, item: object, labels: set[str]) -> LoraEntry | None:
        if not isinstance(item, dict) or not isinstance(item.get("modelVersions"), list):
            return None
        model = {k: item.get(k) for k in ("name", "type", "nsfw")}
        stats = item["stats"] if isinstance(item.get("stats"), dict) else {}
        for raw in item["modelVersions"]:
            if not isinstance(raw, dict) or raw.get("baseModel") not in labels:
                continue
            document = {**raw, "modelId": item.get("id"), "model": model}
            document.setdefault("stats", {"downloadCount": stats.get("downloadCount"), "thumbsUpCount": 0})
            try:
                version = parse_version(document, f"model {item.get('id')}")
                file = check_version(version, self.max_nsfw)
            except CatalogError as e:
                # Unreadable, or refused by the policy (not a LoRA, NSFW, early access, pickles): left out.
                logger.debug("civitai listing: skipping a version of model %s: %s", item.get("id"), e)
                continue
            return version.entry(self.endpoint, self.max_nsfw, file)
        return None

    def _get_json(self, path: str, params: Sequence[tuple[str, str]], where: str) -> Any:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        url = f"{self.endpoint}{path}"
        try:
            response = self._client.get(url, params=list(params), headers=headers, follow_redirects=False)
        except httpx2.TimeoutException as e:
            raise CivitaiUnavailableError(f"Civitai at {self.endpoint} did not answer in time about {where}") from e
        except httpx2.HTTPError as e:
            raise CivitaiUnavailableError(f"Civitai at {self.endpoint} could not be reached about {where}: {e}") from e
        status = response.status_code
        if status == 404:
            raise LoraNotFoundError(
                f"Civitai has no published {where} (or it is not shown to this Space); accepted: the id of a "
                "published Civitai LoRA"
            )
        if status in (401, 403):
            raise RestrictedLoraError(f"Civitai refused to describe {where} (HTTP {status}): it needs a login")
        if status >= 300:
            raise CivitaiUnavailableError(f"Civitai at {self.endpoint} answered HTTP {status} about {where}")
        try:
            return response.json()
        except ValueError as e:
            raise CivitaiUnavailableError(f"Civitai at {self.endpoint} answered malformed JSON about {where}") from e


def _text_name(file: Mapping[str, Any]) -> str:
    name = file.get("name")
    return name if isinstance(name, str) else ""
