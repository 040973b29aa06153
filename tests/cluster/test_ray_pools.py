"""The Ray Serve cluster with two pools (tiny SDXL and tiny SD 1.5): each LoRA is served by its own base's pool.

A LoRA of one base fails on the other pool's engine (its family check), so a 200 for each says the ingress
routed it to its own pool. Marked `ray`: `pytest -m ray tests/cluster/test_ray_pools.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("ray.serve")

from engine.models import PoolSetting
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from serving.cluster.app import local_cluster
from tests.support.app_server import free_port
from tests.support.loras import SD15, SDXL, card, peft_file
from tests.support.sd15 import write_sd15_loras

pytestmark = pytest.mark.ray

TIMEOUT = httpx.Timeout(300.0)


@pytest.fixture(scope="module")
def repos(hub, loaded, loaded_sd15, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("ray-pools")
    sd15 = folder / write_sd15_loras(loaded_sd15.pipe, folder)["peft"]
    hub.add_repo("raypools/sd15", {"README.md": card(SD15), "pytorch_lora_weights.safetensors": sd15.read_bytes()})
    hub.add_repo(
        "raypools/sdxl", {"README.md": card(SDXL), "pytorch_lora_weights.safetensors": peft_file(loaded.pipe, seed=81)}
    )
    return {"sd15": "raypools/sd15", "sdxl": "raypools/sdxl"}


@pytest.fixture(scope="module")
def cluster(base_settings, tiny_dir, tiny_sd15_dir, repos) -> Iterator[str]:
    settings = base_settings.replace(
        pools=(PoolSetting(str(tiny_dir), SDXL), PoolSetting(str(tiny_sd15_dir), SD15_MODEL_ID)),
        cluster_replicas=1,
        cluster_max_ongoing=1,
        cluster_adapter_sets=2,
        cluster_gpus_per_replica=0.0,
    )
    with local_cluster(settings, port=free_port(), name="pools") as url:
        yield url


def post(url: str, **parameters: object) -> httpx.Response:
    content = json.dumps({"inputs": "a fox", "parameters": {"num_inference_steps": 2, "seed": 3, **parameters}})
    return httpx.post(url, content=content, timeout=TIMEOUT)


def test_each_lora_runs_on_its_own_bases_pool(cluster, repos):
    for role in ("sd15", "sdxl", "sd15"):
        answer = post(cluster, loras=[{"path": repos[role]}])
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("image/")
    mixed = post(cluster, loras=[{"path": repos["sd15"]}, {"path": repos["sdxl"]}])
    assert mixed.status_code == 400 and "one base" in mixed.json()["error"]
    # The engine's own family check still guards a named base that does not fit the LoRA.
    wrong = httpx.post(
        f"{cluster}models/{SDXL}",
        content=json.dumps({"inputs": "a fox", "parameters": {"loras": [{"path": repos["sd15"]}]}}),
        timeout=TIMEOUT,
    )
    assert wrong.status_code == 400, wrong.text
