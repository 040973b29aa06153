"""The cluster's ingress: the Space's HTTP contract in front of one Serve deployment per base-model pool.

- `POST /` with the `lora` header, and `POST /models/<base>`: parsed by `serving.http.api.parse_body`,
  answered with the same bytes, `X-*` headers and JSON errors as the Space (plus `X-Replica`).
- `POST /v1/generate` (and `/v1/models/<base>/generate`): a whole `GenerateRequest` as JSON from the
  Space's `RemoteBackend`, answered with a PNG and the rest of the result (`serving.cluster.wire`);
  `GET /v1/pools`, `GET /v1/status?base=` and `POST /v1/check`: the backend's other operations.

Routing, as the Space's `engine.pools.pools.Pools.route` does it: a named base picks its pool; otherwise a
request's LoRAs pick theirs (by what each says of its base: card and tags, else its file's metadata and
shapes, judged on a replica of the default pool, `PoolReplica.origin`, and kept per file here), and must
agree (a 400 naming each LoRA's base when they do not); a request without either goes to the default pool.
Each request goes to its pool's deployment with its adapter set as the multiplexed model id, so Serve's
router prefers a replica that holds it. A request without a seed gets one here, so a retry after a replica
died (the one kind of failure retried) produces the same image the first try would have. This module imports
no Ray (`serving.cluster.app` hands it Ray's failure classes), so its routing is tested without a cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from starlette.requests import Request
from starlette.responses import Response

from engine.errors import BackendUnavailableError, InvalidRequestError, SwitchboardError
from engine.pools.routing import LoraOrigin, PoolInfo, agreed_pool, described_pick, named_pool
from engine.requests import MAX_SEED, GenerateRequest, LoraSpec
from lora_catalog.bases import family_of_base
from serving.cluster.wire import WIRE, Answer, adapter_set_id, request_from_json, request_to_json, spec_from_json
from serving.errors import json_error
from serving.http.api import parse_body, read_body

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

__all__ = ["Ingress", "PoolRoute"]

logger = logging.getLogger(__name__)

# A replica that dies mid-request is replaced by Serve; the request is sent again, to any live replica.
_ATTEMPTS = 3
# Routing decisions kept, by LoRA reference (ref, revision, file): what a LoRA says of its base does not change.
_ORIGINS = 1024


@dataclass(frozen=True)
class PoolRoute:
    """One pool as the ingress sees it: the ids it answers to, and its deployment."""

    model_id: str
    base_model_id: str
    handle: DeploymentHandle

    @property
    def family(self) -> str:
        return str(family_of_base(self.base_model_id))


class Ingress:
    def __init__(
        self,
        pools: Sequence[tuple[str, str, DeploymentHandle]],
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        """`retry_on`: the errors of a replica that died or is unavailable (Ray's, from `serving.cluster.app`)."""
        self._pools = tuple(PoolRoute(*pool) for pool in pools)
        self._retry_on = retry_on
        # Filled on the first request that needs them; the ingress's one event loop is their only user.
        self._infos: tuple[PoolInfo, ...] | None = None
        self._origins: LRUCache[tuple[str, str | None, str | None], LoraOrigin] = LRUCache(maxsize=_ORIGINS)

    async def __call__(self, http: Request) -> Response:
        path = http.url.path.rstrip("/") or "/"
        if http.method == "GET" and path == "/v1/pools":
            return await self._served()
        if http.method == "GET" and path == "/v1/status":
            return await self._describe("status", {}, http.query_params.get("base", ""))
        if http.method != "POST":
            return json_error(InvalidRequestError(f"{http.method} {path} is not served; accepted: POST"))
        if path == "/v1/check":
            return await self._check(http)
        if path == "/":
            return await self._inference_api(http, "")
        if path.startswith("/models/"):
            return await self._inference_api(http, path.removeprefix("/models/"))
        if path == "/v1/generate":
            return await self._wire(http, "")
        if path.startswith("/v1/models/") and path.endswith("/generate"):
            return await self._wire(http, path.removeprefix("/v1/models/").removesuffix("/generate"))
        return json_error(InvalidRequestError(f"POST {path} is not served; accepted: /, /models/<base>, /v1/generate"))

    async def _inference_api(self, http: Request, base: str) -> Response:
        body = await read_body(http)
        if isinstance(body, Response):
            return body
        try:
            parsed = parse_body(body, lora=http.headers.get("lora"), accept=http.headers.get("accept"))
            answer = await self._dispatch(parsed.request, base, parsed.media_type)
        except SwitchboardError as e:
            return json_error(e)
        return _response(answer)

    async def _wire(self, http: Request, base: str) -> Response:
        body = await read_body(http)
        if isinstance(body, Response):
            return body
        try:
            document = _json_body(body, "GenerateRequest")
            answer = await self._dispatch(request_from_json(document), base, WIRE)
        except SwitchboardError as e:
            return json_error(e)
        return _response(answer)

    async def _check(self, http: Request) -> Response:
        body = await read_body(http)
        if isinstance(body, Response):
            return body
        try:
            document = _json_body(body, "LoraSpec")
            # Checked on the pool it would generate on.
            check = GenerateRequest(prompt="check", loras=(spec_from_json(document),))
            pool = await self._route(check, http.query_params.get("base", ""))
        except SwitchboardError as e:
            return json_error(e)
        if isinstance(pool, Answer):
            return _response(pool)
        return await self._describe_on(pool, "check", document)

    async def _describe(self, what: str, document: dict, base: str) -> Response:
        try:
            pool = self._pool(base)
        except SwitchboardError as e:
            return json_error(e)
        return await self._describe_on(pool, what, document)

    async def _describe_on(self, pool: PoolRoute, what: str, document: dict) -> Response:
        return _response(await pool.handle.describe.remote(what, document))

    def _pool(self, base: str) -> PoolRoute:
        """The pool for a named base (its base or model id, any case); the first pool when none is named."""
        return self._pools[named_pool(self._pools, base)] if base.strip() else self._pools[0]

    async def _served(self) -> Response:
        """Every pool as its replicas serve it (`ServedPool`), the default first: what a front end offers."""
        answers = await asyncio.gather(*(p.handle.describe.remote("info", {}) for p in self._pools))
        for answer in answers:
            if answer.status != 200:
                return _response(answer)
        pools = [{**json.loads(a.body), "default": index == 0} for index, a in enumerate(answers)]
        return Response(json.dumps({"pools": pools}), media_type=WIRE)

    async def _route(self, request: GenerateRequest, base: str) -> PoolRoute | Answer:
        """The pool for `request` (see the module docstring), or the error answer a LoRA's lookup gave."""
        if base.strip() or len(self._pools) == 1 or not request.loras:
            return self._pool(base)
        if self._infos is None:
            self._infos = tuple(await asyncio.gather(*(p.handle.info.remote() for p in self._pools)))
        choices = []
        for spec in request.loras:
            origin = await self._origin(spec)
            if isinstance(origin, Answer):
                return origin
            choices.append((spec.ref, *described_pick(f"LoRA {spec.ref!r}", origin, self._infos)))
        index = agreed_pool(choices)
        pool = self._pools[index if index is not None else 0]
        logger.info("route %s -> pool %s", [s.ref for s in request.loras], pool.base_model_id)
        return pool

    async def _origin(self, spec: LoraSpec) -> LoraOrigin | Answer:
        key = (spec.ref, spec.revision, spec.weight_name)
        if key in self._origins:
            return self._origins[key]
        found = await self._pools[0].handle.origin.remote(asdict(spec))
        if isinstance(found, LoraOrigin):
            self._origins[key] = found
        return found

    async def _dispatch(self, request: GenerateRequest, base: str, media_type: str) -> Answer:
        pool = await self._route(request, base)
        if isinstance(pool, Answer):
            return pool
        if request.seed is None:
            request = replace(request, seed=secrets.randbelow(MAX_SEED + 1))
        set_id = adapter_set_id(request)
        handle = pool.handle.options(multiplexed_model_id=set_id) if set_id else pool.handle
        document = request_to_json(request)
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await handle.generate.remote(document, media_type)
            except self._retry_on as e:
                logger.warning(
                    "a replica of %s failed on try %d of %d (%s: %s)",
                    pool.base_model_id,
                    attempt,
                    _ATTEMPTS,
                    type(e).__name__,
                    e,
                )
                failure = e
        raise BackendUnavailableError(
            f"{_ATTEMPTS} replicas of {pool.base_model_id} failed in turn on this request; try again shortly"
        ) from failure


def _json_body(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InvalidRequestError(f"the body is not a JSON {what} ({e})") from e


def _response(answer: Answer) -> Response:
    """A replica's answer as this server's response, its status, type, body and headers unchanged."""
    return Response(answer.body, status_code=answer.status, media_type=answer.media_type, headers=dict(answer.headers))
