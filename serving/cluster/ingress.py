"""The cluster's ingress: the Space's HTTP contract in front of one Serve deployment per base-model pool.

It answers `POST /`, `POST /models/<base>` exactly as the Space does (plus `X-Replica`), and the
`RemoteBackend`'s `/v1/*` operations. Routing is the Space's (`Pools.route`): a named base, else the pool the
request's LoRAs agree on (each LoRA's origin judged on a default-pool replica and kept `_ORIGIN_TTL_S`), else
the default. A request gets a seed here so a retry repeats its image; a call to a replica that died is tried
once more, then answered 503; a client hanging up cancels its call. No Ray import (`serving.cluster.app` passes
Ray's failure classes in), so it is tested without a cluster. The routes and rules in full:
docs/internals.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from cachetools import TTLCache
from starlette.requests import Request
from starlette.responses import Response

from engine.errors import BackendUnavailableError, GenerationCancelledError, InvalidRequestError, SwitchboardError
from engine.pools.routing import LoraOrigin, PoolInfo, agreed_pool, described_pick, named_pool
from engine.requests import MAX_SEED, GenerateRequest, LoraSpec
from lora_catalog.bases import family_of_base
from serving.cluster.wire import WIRE, Answer, adapter_set_id, request_from_json, request_to_json, spec_from_json
from serving.errors import json_error
from serving.http.api import lora_header, parse_body, read_body, unless_disconnected

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

__all__ = ["Ingress", "PoolRoute"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A replica that dies mid-request is replaced by Serve; the request is sent once more, to a live replica.
_ATTEMPTS = 2
# Routing decisions kept, by LoRA reference (ref, revision, file), for as long as the catalogue trusts Hub
# metadata: a revision left unnamed is a branch, which may move to a commit made for another base.
_ORIGINS = 1024
_ORIGIN_TTL_S = 600.0


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
        self._origins: TTLCache[tuple[str, str | None, str | None], LoraOrigin] = TTLCache(
            maxsize=_ORIGINS, ttl=_ORIGIN_TTL_S
        )

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
            headers = http.headers
            lora, accept, content_type = (
                lora_header(headers.get("lora")),
                headers.get("accept"),
                headers.get("content-type"),
            )
            parsed = parse_body(body, lora=lora, accept=accept, content_type=content_type)
        except SwitchboardError as e:
            return json_error(e)
        return await self._answer(http, lambda: self._dispatch(parsed.request, base, parsed.media_type))

    async def _wire(self, http: Request, base: str) -> Response:
        body = await read_body(http)
        if isinstance(body, Response):
            return body
        try:
            request = request_from_json(_json_body(body, "GenerateRequest"))
        except SwitchboardError as e:
            return json_error(e)
        return await self._answer(http, lambda: self._dispatch(request, base, WIRE))

    async def _answer(self, http: Request, dispatch: Callable[[], Awaitable[Answer]]) -> Response:
        """A generation's answer; a client that hangs up first cancels it (the replica's request with it)."""
        try:
            answer = await unless_disconnected(http, dispatch)
        except SwitchboardError as e:
            return json_error(e)
        if answer is None:
            logger.info("%s: the client went away; its request was cancelled", http.url.path)
            return json_error(GenerationCancelledError("the client went away"))
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
        try:
            return _response(await self._call(pool, lambda: pool.handle.describe.remote(what, document)))
        except SwitchboardError as e:
            return json_error(e)

    def _pool(self, base: str) -> PoolRoute:
        """The pool for a named base (its base or model id, any case); the first pool when none is named."""
        return self._pools[named_pool(self._pools, base)] if base.strip() else self._pools[0]

    async def _served(self) -> Response:
        """Every pool as its replicas serve it (`ServedPool`), the default first: what a front end offers."""
        try:
            answers = await asyncio.gather(
                *(self._call(p, partial(p.handle.describe.remote, "info", {})) for p in self._pools)
            )
        except SwitchboardError as e:
            return json_error(e)
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
            self._infos = tuple(await asyncio.gather(*(self._call(p, p.handle.info.remote) for p in self._pools)))
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
        default = self._pools[0]
        found = await self._call(default, lambda: default.handle.origin.remote(asdict(spec)))
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
        answer: Answer = await self._call(pool, lambda: handle.generate.remote(document, media_type))
        return answer

    async def _call(self, pool: PoolRoute, call: Callable[[], Awaitable[T]]) -> T:
        """A call to one of `pool`'s replicas, made once more if that replica died or was unavailable (Serve sends
        it to a live one); BackendUnavailableError (503) when the second fails too."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await call()
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
