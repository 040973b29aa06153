"""The cluster ingress routes by a LoRA's own base, as the Space's pools do (no Ray: fake handles; runs in CI).

The pool replicas' `info` and `origin` are the real `PoolReplica` methods over in-process engines; only
`generate` is a stand-in that records which pool received the request.
"""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.settings import SD15_MODEL_ID
from lora_catalog.hub import HubSource
from serving.cluster.ingress import Ingress
from serving.cluster.replica import PoolReplica
from serving.cluster.wire import Answer
from tests.support.loras import FLUX, SD15, SDXL, card, peft_file


class _Method:
    def __init__(self, fn) -> None:
        self._fn = fn
        self.calls = 0

    def remote(self, *args):
        self.calls += 1
        return self._fn(*args)


class FakeHandle:
    """A deployment handle over one in-process replica; `generate` records the pool it reached."""

    def __init__(self, name: str, engine: Engine, reached: list[str]) -> None:
        replica = object.__new__(PoolReplica)
        replica._engine = engine  # what `info` and `origin` read
        self.info = _Method(replica.info)
        self.origin = _Method(replica.origin)
        self.describe = _Method(self._describe)
        self.generate = _Method(self._generate)
        self._name = name
        self._reached = reached

    def options(self, **kwargs: object) -> FakeHandle:
        return self

    async def _generate(self, document: dict, media_type: str) -> Answer:
        self._reached.append(self._name)
        return Answer(200, "application/json", json.dumps({"pool": self._name}).encode())

    async def _describe(self, what: str, document: dict) -> Answer:
        self._reached.append(self._name)
        return Answer(200, "application/json", json.dumps({"pool": self._name, "what": what}).encode())


@pytest.fixture(scope="module")
def repos(hub, loaded) -> dict[str, str]:
    names = {"sd15": SD15, "sdxl": SDXL, "flux": FLUX}
    for role, base in names.items():
        hub.add_repo(f"routing/{role}", {"README.md": card(base), "lora.safetensors": peft_file(loaded.pipe, seed=71)})
    return {role: f"routing/{role}" for role in names}


@pytest.fixture
def cluster(loaded, loaded_sd15, base_settings, hub, repos):
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5), local_dir=None, token=None, max_bytes=base_settings.max_adapter_bytes
    )
    engines = [
        Engine(loaded, base_settings, resolver),
        Engine(loaded_sd15, base_settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    reached: list[str] = []
    handles = [FakeHandle("sdxl", engines[0], reached), FakeHandle("sd15", engines[1], reached)]
    ingress = Ingress([("m-sdxl", SDXL, handles[0]), ("m-sd15", SD15_MODEL_ID, handles[1])])

    async def app(scope, receive, send) -> None:
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    # No `with`: the app answers HTTP only, no lifespan events.
    yield TestClient(app), reached, handles
    for engine in engines:
        engine.close()


def post(client, lora: str | None = None, path: str = "/"):
    headers = {"lora": lora} if lora else {}
    return client.post(path, json={"inputs": "a fox", "parameters": {"seed": 1}}, headers=headers)


def test_each_lora_goes_to_the_pool_of_its_own_base(cluster, repos):
    client, reached, _ = cluster
    for role in ("sd15", "sdxl", "sd15"):
        assert post(client, repos[role]).status_code == 200
    assert post(client).status_code == 200  # no LoRA: the default pool
    assert post(client, path=f"/models/{SD15_MODEL_ID}").status_code == 200
    assert reached == ["sd15", "sdxl", "sd15", "sdxl", "sd15"]


def test_a_loras_origin_is_looked_up_once(cluster, repos):
    client, _, handles = cluster
    for _ in range(3):
        assert post(client, repos["sd15"]).status_code == 200
    assert handles[0].origin.calls == 1
    assert handles[1].origin.calls == 0  # asked of the default pool's replicas only


def test_loras_of_two_bases_in_one_request_are_refused_naming_each(cluster, repos):
    client, reached, _ = cluster
    answer = client.post(
        "/",
        json={"inputs": "a fox", "parameters": {"loras": [{"path": repos["sd15"]}, {"path": repos["sdxl"]}]}},
    )
    assert answer.status_code == 400
    message = answer.json()["error"]
    assert repos["sd15"] in message and repos["sdxl"] in message and "one base" in message
    assert reached == []


def test_unserved_and_unknown_loras_get_the_engines_errors(cluster, repos):
    client, reached, _ = cluster
    flux = post(client, repos["flux"])
    assert flux.status_code == 404
    assert "FLUX" in flux.json()["error"] and SD15_MODEL_ID in flux.json()["error"]
    missing = post(client, "routing/no-such-lora")
    assert missing.status_code == 404 and "routing/no-such-lora" in missing.json()["error"]
    assert reached == []


def test_a_lora_check_runs_on_its_own_pool(cluster, repos):
    client, reached, _ = cluster
    answer = client.post("/v1/check", json={"ref": repos["sd15"]})
    assert answer.status_code == 200 and answer.json() == {"pool": "sd15", "what": "check"}
    assert reached == ["sd15"]
