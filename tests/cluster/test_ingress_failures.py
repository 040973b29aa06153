"""The cluster's edges under failure, without Ray (issue 20, defects 8 and 9, and the lower-severity ones).

The front end's routes over a `ServeBackend` are driven with stand-in handles, as `test_routing.py` does:
malformed wire bodies, replicas that die (tried once more with the same seed, then a 503), a UTF-8 `lora`
header, a LoRA's origin kept for a while only, a replica's error raised as the tree's own, and a `BACKEND_URL`
front end whose cancelled request closes its connection so the replica's request leaves the queue.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import httpx
import pytest
from cachetools import TTLCache
from PIL import Image
from starlette.testclient import TestClient

from engine.errors import BackendUnavailableError, GatedLoraError, SettingsError
from engine.families.origin import LoraOrigin
from engine.normalise import normalise_request
from engine.outcomes import ServedPool
from engine.pools.routing import PoolInfo
from engine.requests import GenerateRequest, GenerateResult, Limits, ModelDefaults, Timings
from engine.settings import Settings
from lora_catalog.entries import Family
from serving.backends import blocking, submit_blocking
from serving.backends import ray_serve as ray_serve_module
from serving.backends.local import LocalBackend
from serving.backends.ray_serve import ServeBackend
from serving.backends.remote import RemoteBackend
from serving.cluster.wire import pools_to_json
from tests.support.app_server import serve_asgi
from tests.support.loras import SD15, SDXL
from tests.support.reliability_app import hold_pipeline
from tests.support.serve_handles import Method, ReplicaHandle, client, front_end, replica_of, stand_in_ray
from tests.support.waits import wait_until

WAIT_S = 60
SETTINGS = Settings()
DEFAULTS = ModelDefaults(steps=25, guidance=5.0, side=1024, max_side=1536)


class ReplicaDied(Exception):
    """Stands in for Ray's RayActorError / ReplicaUnavailableError (what `serving.cluster.app` hands the ingress)."""


class TaskError(Exception):
    """Stands in for Ray's RayTaskError: what a replica raised, kept as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the replica raised {cause!r}")
        self.cause = cause


class Handle:
    """A deployment handle over in-process stand-ins: `generate` answers a blank image for the request sent."""

    def __init__(self, base: str, family: Family = Family.SDXL) -> None:
        self.base = base
        self.family = family
        died = lambda: ReplicaDied(f"the replica of {base} died")  # noqa: E731
        self.generate = Method(self._generate, died)
        self.describe = Method(self._describe, died)
        self.status = Method(self._never, died)
        self.check = Method(self._never, died)
        self.origin = Method(self._never, died)

    def options(self, **kwargs: object) -> Handle:
        return self

    async def _generate(self, request: GenerateRequest) -> GenerateResult:
        checked = normalise_request(request, DEFAULTS, Limits(4, 150, 4000))
        return GenerateResult(Image.new("RGB", (8, 8)), checked.seed, checked, Timings(), served_by=self.base)

    async def _describe(self) -> tuple[ServedPool, PoolInfo]:
        info = PoolInfo(self.base, self.family, frozenset({2048}), frozenset({768, 1280}))
        return ServedPool(self.base, self.base, str(self.family), DEFAULTS, False), info

    async def _never(self, *args: object) -> object:
        raise AssertionError("not called here")


def single(failures: int = 0, method: str = "generate") -> tuple[TestClient, Handle]:
    handle = Handle(SDXL)
    app, _ = front_end([handle], SETTINGS, retry_on=(ReplicaDied,))
    getattr(handle, method).failures = failures
    return next(client(app)), handle


# -- defect 8: the front end's edges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [{"prompt": "x", "loras": [{"ref": 5}]}, {"prompt": "x", "loras": [{"ref": "o/a", "revision": ["main"]}]}],
)
def test_a_malformed_wire_body_is_a_400(document):
    client, handle = single()
    answer = client.post("/v1/generate", json=document)
    assert answer.status_code == 400 and answer.json()["error_type"] == "InvalidRequestError"
    assert handle.generate.calls == []


def test_a_bad_request_is_refused_without_a_replica():
    client, handle = single()
    answer = client.post("/", json={"inputs": "a fox", "parameters": {"num_inference_steps": 9999}})
    assert answer.status_code == 400 and "steps=9999" in answer.json()["error"]
    assert handle.generate.calls == []


def test_a_replica_that_dies_is_tried_once_more_with_the_same_seed():
    client, handle = single(failures=1)
    answer = client.post("/v1/generate", json={"prompt": "a fox"})
    assert answer.status_code == 200
    first, second = (call[0] for call in handle.generate.calls)
    assert first == second and first.seed is not None
    assert answer.json()["result"]["seed"] == first.seed


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("generate", lambda c: c.post("/v1/generate", json={"prompt": "a fox"})),
        ("generate", lambda c: c.post("/", json={"inputs": "a fox"})),
        ("status", lambda c: c.get("/v1/status")),
        ("check", lambda c: c.post("/v1/check", json={"ref": "o/a"})),
    ],
)
def test_replicas_that_die_twice_are_a_503_on_every_call(method, call):
    client, handle = single(failures=10, method=method)
    answer = call(client)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error_type"] == "BackendUnavailableError"
    assert len(getattr(handle, method).calls) == 2


def test_a_pool_that_cannot_describe_itself_stops_the_front_end_saying_so():
    handle = Handle(SDXL)
    handle.describe.failures = 10
    with pytest.raises(BackendUnavailableError, match="2 replicas of pool 0 failed"):
        blocking(ServeBackend.connect([handle], SETTINGS, retry_on=(ReplicaDied,)))


def test_a_replicas_error_is_raised_as_the_trees_own_class():
    handle = Handle(SDXL)
    gated = GatedLoraError("LoRA 'o/a' is gated")

    async def refuse(request: GenerateRequest) -> GenerateResult:
        raise TaskError(gated)

    handle.generate = Method(refuse)
    app, backend = front_end([handle], SETTINGS, retry_on=(ReplicaDied,))
    with pytest.raises(GatedLoraError) as raised:
        blocking(backend.generate(GenerateRequest(prompt="a fox")))
    assert raised.value is gated
    answer = next(client(app)).post("/", json={"inputs": "a fox"})
    assert (answer.status_code, answer.json()) == (403, {"error": str(gated), "error_type": "GatedLoraError"})


def test_the_lora_header_is_read_as_utf8():
    client, handle = single()
    name = "local:étoile ✨.safetensors"
    answer = client.post("/", json={"inputs": "a fox"}, headers={"lora": name.encode()})  # UTF-8 bytes, as curl
    assert answer.status_code == 200
    assert handle.generate.calls[0][0].loras[0].ref == name


def test_a_loras_origin_is_asked_again_after_its_ttl(monkeypatch):
    # Two pools, so the front end asks the default pool's replica what a LoRA's base is.
    # The origins' TTL cache reads this test's clock (cachetools' `timer`), so the TTL passes when the test says.
    now = [0.0]
    monkeypatch.setattr(ray_serve_module, "TTLCache", functools.partial(TTLCache, timer=lambda: now[0]))
    sdxl, sd15 = Handle(SDXL), Handle(SD15, Family.SD15)

    async def origin(spec: object) -> LoraOrigin:
        return LoraOrigin(bases=(SD15,), families=(Family.SD15,), how="card")

    sdxl.origin = Method(origin)
    app, _ = front_end([sdxl, sd15], SETTINGS, retry_on=(ReplicaDied,))
    made = next(client(app))
    for _ in range(2):
        answer = made.post("/", json={"inputs": "a fox"}, headers={"lora": "o/a"})
        assert answer.status_code == 200 and answer.headers["x-replica"] == SD15
    assert len(sdxl.origin.calls) == 1
    now[0] += ray_serve_module._ORIGIN_TTL_S + 1
    assert made.post("/", json={"inputs": "a fox"}, headers={"lora": "o/a"}).status_code == 200
    assert len(sdxl.origin.calls) == 2


# -- defect 9: BACKEND_URL's cancel reaches the replica ---------------------------------------------------------


@pytest.fixture
def cluster(make_engine, base_settings, monkeypatch) -> Iterator[tuple[str, object, object]]:
    stand_in_ray(monkeypatch)
    engine = make_engine()
    app, _ = front_end([ReplicaHandle(replica_of(engine))], base_settings)
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
        wait_until(lambda: engine.waiting >= 1, "the request in the replica's queue", WAIT_S)
        waiting.cancel()
        wait_until(lambda: engine.waiting == 0, "the cancelled request to leave the replica's queue", WAIT_S)
        wait_until(lambda: not server.server_state.connections, "the connection closed after the cancel", WAIT_S)
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


def test_the_wire_body_limit_is_the_settings_max_body_bytes():
    # A cluster whose MAX_BODY_BYTES is 64 KiB refuses a larger wire body by that limit, before reading it.
    app, _ = front_end([Handle(SDXL)], Settings(max_body_bytes=64 * 1024), retry_on=(ReplicaDied,))
    answer = next(client(app)).post("/v1/generate", content=b"x" * (100 * 1024))
    assert answer.status_code == 413 and "accepted: at most 65536 bytes" in answer.json()["error"]
