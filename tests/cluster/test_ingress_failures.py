"""The cluster's edges under failure, without Ray (issue 20, defects 8 and 9, and the lower-severity ones).

The ingress is driven with in-process replicas, as `test_routing.py` does: malformed wire bodies, replicas that
die (tried once more, then a 503), a UTF-8 `lora` header, a LoRA's origin kept for a while only, and a
`BACKEND_URL` front end whose cancelled request closes its connection so the replica's request leaves the queue.
"""

from __future__ import annotations

import json
import sys
import time
import types
from collections.abc import Iterator

import httpx
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from engine.errors import BackendUnavailableError, SettingsError
from engine.families.origin import LoraOrigin
from engine.outcomes import ServedPool
from engine.pools.routing import PoolInfo
from engine.requests import GenerateRequest, ModelDefaults
from lora_catalog.entries import Family
from serving.backends import blocking, submit_blocking
from serving.backends.local import LocalBackend
from serving.backends.remote import RemoteBackend
from serving.cluster import ingress as ingress_module
from serving.cluster.ingress import Ingress
from serving.cluster.replica import PoolReplica
from serving.cluster.stats import SetBook
from serving.cluster.wire import WIRE, Answer, pools_to_json
from tests.support.app_server import serve_asgi
from tests.support.loras import SD15, SDXL
from tests.support.reliability_app import hold_pipeline

WAIT_S = 60


class ReplicaDied(Exception):
    """Stands in for Ray's RayActorError / ReplicaUnavailableError (what `serving.cluster.app` hands the ingress)."""


class Method:
    """A handle's method: `.remote(...)` returns an awaitable, as Serve's DeploymentResponse is."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self.calls: list[tuple] = []

    def remote(self, *args):
        self.calls.append(args)
        return self._fn(*args)


class Handle:
    """A deployment handle over in-process functions; `failures` calls of each method die first."""

    def __init__(self, name: str, failures: int = 0) -> None:
        self.name = name
        self.failures = failures
        self.generate = Method(self._generate)
        self.describe = Method(self._describe)
        self.info = Method(self._info)
        self.origin = Method(self._origin)

    def options(self, **kwargs: object) -> Handle:
        return self

    async def _die(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ReplicaDied(f"the replica of {self.name} died")

    async def _generate(self, document: dict, media_type: str) -> Answer:
        await self._die()
        return Answer(200, WIRE, json.dumps({"pool": self.name, "request": document}).encode())

    async def _describe(self, what: str, document: dict) -> Answer:
        await self._die()
        return Answer(200, WIRE, json.dumps({"pool": self.name, "what": what}).encode())

    async def _info(self):
        await self._die()
        raise AssertionError("routing is not needed here")

    async def _origin(self, document: dict):
        await self._die()
        raise AssertionError("routing is not needed here")


def client_of(ingress: Ingress) -> TestClient:
    async def app(scope, receive, send) -> None:
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    return TestClient(app)


def single(failures: int = 0) -> tuple[TestClient, Handle]:
    handle = Handle("sdxl", failures)
    return client_of(Ingress([("m-sdxl", SDXL, handle)], retry_on=(ReplicaDied,))), handle


# -- defect 8: the ingress's edges -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [{"prompt": "x", "loras": [{"ref": 5}]}, {"prompt": "x", "loras": [{"ref": "o/a", "revision": ["main"]}]}],
)
def test_a_malformed_wire_body_is_a_400(document):
    client, handle = single()
    answer = client.post("/v1/generate", json=document)
    assert answer.status_code == 400 and answer.json()["error_type"] == "InvalidRequestError"
    assert handle.generate.calls == []


def test_a_replica_that_dies_is_tried_once_more_with_the_same_seed():
    client, handle = single(failures=1)
    answer = client.post("/v1/generate", json={"prompt": "a fox"})
    assert answer.status_code == 200
    first, second = (call[0] for call in handle.generate.calls)
    assert first == second and first["seed"] is not None


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("generate", lambda c: c.post("/v1/generate", json={"prompt": "a fox"})),
        ("generate", lambda c: c.post("/", json={"inputs": "a fox"})),
        ("describe", lambda c: c.get("/v1/pools")),
        ("describe", lambda c: c.get("/v1/status")),
        ("describe", lambda c: c.post("/v1/check", json={"ref": "o/a"})),
    ],
)
def test_replicas_that_die_twice_are_a_503_on_every_call(method, call):
    client, handle = single(failures=10)
    answer = call(client)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error_type"] == "BackendUnavailableError"
    assert len(getattr(handle, method).calls) == 2


def test_the_lora_header_is_read_as_utf8():
    client, _ = single()
    name = "local:étoile ✨.safetensors"
    answer = client.post("/", json={"inputs": "a fox"}, headers={"lora": name.encode()})  # UTF-8 bytes, as curl
    assert answer.status_code == 200
    assert answer.json()["request"]["loras"][0]["ref"] == name


def test_a_loras_origin_is_asked_again_after_its_ttl(monkeypatch):
    # Two pools, so the ingress asks the default pool's replica what a LoRA's base is.
    monkeypatch.setattr(ingress_module, "_ORIGIN_TTL_S", 0.2)
    sdxl, sd15 = Handle("sdxl"), Handle("sd15")

    async def info_sdxl() -> PoolInfo:
        return PoolInfo(SDXL, Family.SDXL, frozenset({2048}), frozenset({768, 1280}))

    async def info_sd15() -> PoolInfo:
        return PoolInfo(SD15, Family.SD15, frozenset({768}), frozenset({768}))

    async def origin(document: dict) -> LoraOrigin:
        return LoraOrigin(bases=(SD15,), families=(Family.SD15,), how="card")

    sdxl.info, sd15.info, sdxl.origin = Method(info_sdxl), Method(info_sd15), Method(origin)
    client = client_of(Ingress([("m-sdxl", SDXL, sdxl), ("m-sd15", SD15, sd15)], retry_on=(ReplicaDied,)))
    for _ in range(2):
        answer = client.post("/", json={"inputs": "a fox"}, headers={"lora": "o/a"})
        assert answer.status_code == 200 and answer.json()["pool"] == "sd15"
    assert len(sdxl.origin.calls) == 1
    time.sleep(0.3)
    assert client.post("/", json={"inputs": "a fox"}, headers={"lora": "o/a"}).status_code == 200
    assert len(sdxl.origin.calls) == 2


# -- defect 9: BACKEND_URL's cancel reaches the replica ---------------------------------------------------------


@pytest.fixture
def fake_ray(monkeypatch) -> None:
    """`PoolReplica.generate` asks Serve for the request's multiplexed id: none here (no Ray installed)."""
    serve = types.SimpleNamespace(get_multiplexed_model_id=lambda: "")
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(serve=serve))
    monkeypatch.setitem(sys.modules, "ray.serve", serve)


class ReplicaHandle:
    """A handle over a real `PoolReplica` (its engine, its LocalBackend), as Serve would call it."""

    def __init__(self, replica: PoolReplica) -> None:
        self.generate = Method(replica.generate)
        self.describe = Method(replica.describe)
        self.info = Method(replica.info)
        self.origin = Method(replica.origin)

    def options(self, **kwargs: object) -> ReplicaHandle:
        return self


@pytest.fixture
def cluster(make_engine, fake_ray) -> Iterator[tuple[str, object, object]]:
    engine = make_engine()
    replica = object.__new__(PoolReplica)
    replica._engine, replica._backend, replica._replica = engine, LocalBackend.of(engine), "replica-1"
    replica._book = SetBook()  # what its generate reports to the router
    ingress = Ingress([("m", SDXL, ReplicaHandle(replica))])

    async def app(scope, receive, send) -> None:
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    with serve_asgi(app) as (url, server):
        yield url.rstrip("/"), engine, server


def test_a_cancelled_front_end_request_leaves_the_replicas_queue(cluster, loaded, monkeypatch):
    url, engine, server = cluster
    held = hold_pipeline(loaded, monkeypatch)
    holder = submit_blocking(LocalBackend.of(engine).generate(GenerateRequest(prompt="hold", steps=1, seed=1)))
    try:
        assert held.running.wait(WAIT_S)
        remote = RemoteBackend(url, timeout_s=WAIT_S)
        waiting = submit_blocking(remote.generate(GenerateRequest(prompt="a fox", steps=1, seed=2)))
        deadline = time.monotonic() + WAIT_S
        while engine.waiting < 1:
            assert time.monotonic() < deadline, "the request never reached the replica's queue"
            time.sleep(0.05)
        waiting.cancel()
        while engine.waiting > 0:
            assert time.monotonic() < deadline, "the replica kept the cancelled request queued"
            time.sleep(0.05)
        while server.server_state.connections:
            assert time.monotonic() < deadline, "a connection stayed open after the cancel"
            time.sleep(0.05)
    finally:
        held.gate.set()
    holder.result(WAIT_S)


# -- lower severity: BACKEND_URL's credentials are never shown --------------------------------------------------


def test_backend_url_credentials_are_never_shown():
    state = {"up": True}

    def cluster(http: httpx.Request) -> httpx.Response:
        assert http.url.userinfo == b"user:secret"  # sent, as basic auth
        if state["up"]:
            return httpx.Response(200, json=pools_to_json((_POOL,)))
        raise httpx.ConnectError(f"cannot reach {http.url}", request=http)

    remote = RemoteBackend("http://user:secret@cluster", timeout_s=5, transport=httpx.MockTransport(cluster))
    assert "secret" not in remote.url
    state["up"] = False
    with pytest.raises(BackendUnavailableError) as down:
        blocking(remote.generate(GenerateRequest(prompt="x")))
    with pytest.raises(SettingsError) as refused:
        RemoteBackend("http://user:secret@cluster", timeout_s=5, transport=httpx.MockTransport(cluster))
    for error in (down.value, refused.value):
        assert "secret" not in str(error) and "***@cluster" in str(error)
        assert error.__cause__ is None


_POOL = ServedPool(SDXL, SDXL, "sdxl", ModelDefaults(steps=25, guidance=5.0, side=1024, max_side=1536), True)
