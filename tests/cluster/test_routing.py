"""The cluster's front end routes by a LoRA's own base, as the Space's pools do (no Ray: stand-in handles; runs
in CI).

Each pool's replica is a real `PoolReplica` over an in-process engine; the handles record which pool each call
reached. Routing is `engine.pools.routing`'s, so a request goes where one process would send it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.compare import CompareRequest
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from lora_catalog.hub import HubSource
from serving.backends import blocking
from tests.support.loras import FLUX, SD15, SDXL, card, peft_file
from tests.support.sd15 import write_sd15_loras
from tests.support.serve_handles import ReplicaHandle, client, front_end, replica_of, stand_in_ray

BODY = {"inputs": "a fox", "parameters": {"seed": 1, "num_inference_steps": 1, "width": 64, "height": 64}}


@pytest.fixture(scope="module")
def repos(hub, loaded, loaded_sd15, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("routing")
    sd15 = (folder / write_sd15_loras(loaded_sd15.pipe, folder)["peft"]).read_bytes()
    files = {"sd15": (SD15, sd15), "sdxl": (SDXL, peft_file(loaded.pipe, seed=71)), "flux": (FLUX, b"never read")}
    for role, (base, data) in files.items():
        hub.add_repo(f"routing/{role}", {"README.md": card(base), "lora.safetensors": data})
    return {role: f"routing/{role}" for role in files}


@pytest.fixture
def cluster(loaded, loaded_sd15, base_settings, hub, repos, monkeypatch) -> Iterator[tuple]:
    stand_in_ray(monkeypatch)
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5), local_dir=None, token=None, max_bytes=base_settings.max_adapter_bytes
    )
    engines = [
        Engine(loaded, base_settings, resolver),
        Engine(loaded_sd15, base_settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    handles = [ReplicaHandle(replica_of(engine, name)) for engine, name in zip(engines, ("sdxl", "sd15"), strict=True)]
    app, backend = front_end(handles, base_settings)
    for made in client(app):
        yield made, handles, backend
    for engine in reversed(engines):
        engine.close()


def reached(handles: list[ReplicaHandle], method: str = "generate") -> list[str]:
    return [name for name, h in zip(("sdxl", "sd15"), handles, strict=True) for _ in h.method(method).calls]


def post(client, lora: str | None = None, path: str = "/"):
    return client.post(path, json=BODY, headers={"lora": lora} if lora else {})


def test_each_lora_goes_to_the_pool_of_its_own_base(cluster, repos):
    client, handles, _ = cluster
    for role in ("sd15", "sdxl", "sd15"):
        answer = post(client, repos[role])
        assert answer.status_code == 200, answer.text
    assert post(client).headers["x-replica"] == "sdxl"  # no LoRA: the default pool
    assert post(client, path=f"/models/{SD15_MODEL_ID}").headers["x-replica"] == "sd15"
    assert sorted(reached(handles)) == sorted(["sd15", "sdxl", "sd15", "sdxl", "sd15"])
    assert [len(h.generate.calls) for h in handles] == [2, 3]


def test_the_pools_describe_themselves_once_and_a_loras_origin_is_looked_up_once(cluster, repos):
    client, handles, _ = cluster
    for _ in range(3):
        assert post(client, repos["sd15"]).status_code == 200
    assert client.get("/v1/pools").json()["pools"][1]["base_model_id"] == SD15_MODEL_ID
    assert [len(h.describe.calls) for h in handles] == [1, 1]  # at start only
    assert len(handles[0].origin.calls) == 1
    assert handles[1].origin.calls == []  # asked of the default pool's replicas only


def test_loras_of_two_bases_in_one_request_are_refused_naming_each(cluster, repos):
    client, handles, _ = cluster
    both = {**BODY, "parameters": {"loras": [{"path": repos["sd15"]}, {"path": repos["sdxl"]}]}}
    answer = client.post("/", json=both)
    assert answer.status_code == 400
    message = answer.json()["error"]
    assert repos["sd15"] in message and repos["sdxl"] in message and "one base" in message
    assert reached(handles) == []


def test_unserved_and_unknown_loras_get_the_engines_errors(cluster, repos):
    client, handles, _ = cluster
    flux = post(client, repos["flux"])
    assert flux.status_code == 404
    assert "FLUX" in flux.json()["error"] and SD15_MODEL_ID in flux.json()["error"]
    missing = post(client, "routing/no-such-lora")
    assert missing.status_code == 404 and "routing/no-such-lora" in missing.json()["error"]
    assert missing.json()["error_type"] == "LoraNotFoundError"
    assert reached(handles) == []


def test_a_lora_check_runs_on_its_own_pool(cluster, repos):
    client, handles, _ = cluster
    answer = client.post("/v1/check", json={"ref": repos["sd15"]})
    assert answer.status_code == 200 and answer.json()["ref"] == repos["sd15"]
    assert reached(handles, "check") == ["sd15"]


def test_a_comparison_runs_on_its_loras_pool_in_one_replica_call(cluster, repos):
    _, handles, backend = cluster
    request = CompareRequest(
        prompt="a fox", loras=(LoraSpec(repos["sd15"]),), scales=(0.5, 1.0), steps=1, width=64, height=64, seed=4
    )
    result = blocking(backend.compare(request))
    assert len(result.results) == 2 and {r.seed for r in result.results} == {4}
    assert reached(handles, "compare") == ["sd15"]
