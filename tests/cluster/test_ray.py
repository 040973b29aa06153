"""The Ray Serve cluster (serving/cluster/app.py) on a local Ray instance: two CPU replicas of the tiny pipeline.

Its front end is the Space's own app over a `ServeBackend`, so its `POST /`, Gradio API and metrics are compared
with the single-process app's over the same tiny pipeline: same status, same headers, the same bytes for errors
and the same image within 2 levels per channel. Bit-exact claims stay within one process: torch's float sums depend on
its thread count, so the replicas run on this process's (`CLUSTER_CPU_THREADS`; Ray would give them one), and
images are compared as decoded pixels, not bytes. Marked `ray` (a cluster takes a minute or more to start on two
shared cores):
`pytest -m ray tests/cluster/test_ray.py`.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("ray.serve")

import ray
from ray import serve
from ray.serve._private.constants import DEFAULT_REQUEST_ROUTER_PATH

from engine.pipeline.loading import load_pipeline
from engine.requests import GenerateRequest, LoraSpec
from serving.cluster.app import build_app, deployment_name, local_cluster
from serving.cluster.replica import weights_digest
from serving.cluster.shape import ROUTER_CLASS, router_kwargs
from serving.cluster.wire import adapter_set_id
from tests.support.app_server import free_port, serve_fixture_app, serve_routes
from tests.support.checks import backend_of, generate
from tests.support.clients import api_client
from tests.support.images import assert_images_close
from tests.support.waits import wait_until

pytestmark = pytest.mark.ray

APP = "switchboard"
TIMEOUT = httpx.Timeout(300.0)
CONTRACT_HEADERS = ("content-type", "x-seed", "x-lora-cache")


def body(prompt: str = "a fox in a forest", seed: int = 11, steps: int = 2, **parameters: object) -> str:
    return json.dumps({"inputs": prompt, "parameters": {"num_inference_steps": steps, "seed": seed, **parameters}})


def post(url: str, content: str, **headers: str) -> httpx.Response:
    return httpx.post(url, content=content, headers=headers, timeout=TIMEOUT)


def at_once(count: int, call: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """`call(0)` ... `call(count - 1)` from as many threads at once; their answers in that order."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))


def assert_same_answer(got: httpx.Response, expected: httpx.Response, what: object) -> None:
    """The same status and type; an image the same within 2 levels per channel, anything else the same bytes."""
    assert got.status_code == expected.status_code, (what, got.text[:300])
    assert got.headers.get("content-type") == expected.headers.get("content-type"), what
    if expected.headers.get("content-type", "").startswith("image/"):
        assert_images_close(got.content, expected.content, what)
    else:
        assert got.content == expected.content, what


@pytest.fixture(scope="module")
def cluster_settings(base_settings):
    return base_settings.replace(
        cluster_replicas=2,
        cluster_max_ongoing=1,
        cluster_adapter_sets=3,
        cluster_gpus_per_replica=0.0,
        # The single-process app's thread count: torch's float sums depend on it, and JPEG turns a float
        # difference of 1e-6 into pixels 3 levels apart.
        cluster_cpu_threads=torch.get_num_threads(),
        cluster_stats_period_s=0.5,
        metrics=True,
    )


@pytest.fixture(scope="module")
def cluster(cluster_settings, fixtures) -> Iterator[str]:
    with local_cluster(cluster_settings, port=free_port(), name=APP) as url:
        yield url


@pytest.fixture
def single(engine) -> Iterator[str]:
    """The single-process app's POST / over the session's tiny pipeline."""
    with serve_routes(backend_of(engine)) as url:
        yield url


def pool_deployment(settings) -> str:
    return deployment_name(settings.base_model_id)


def replica_weights(settings, expected: int) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each replica's weight digest (base restored) and cached adapters, asking until `expected` replicas answered."""
    handle = serve.get_deployment_handle(pool_deployment(settings), app_name=APP)
    seen: dict[str, tuple[str, tuple[str, ...]]] = {}
    deadline = time.monotonic() + 120
    while len(seen) < expected and time.monotonic() < deadline:
        replica, digest, cached = handle.weights.remote().result(timeout_s=120)
        seen[replica] = (digest, cached)
    return seen


def replica_actor(settings, replica: str) -> str:
    """The Ray actor name of one replica of the pool (`X-Replica` is its id)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return next(n for n in names if pool_deployment(settings) in n and n.endswith(f"#{replica}"))


def running_replicas(settings) -> int:
    status = serve.status().applications[APP].deployments[pool_deployment(settings)]
    return status.replica_states.get("RUNNING", 0)


def test_the_http_contract_answers_like_the_single_process_app(cluster, single, fixtures):
    cases = [
        (body(), {}),
        (body(seed=5), {"lora": fixtures["peft"]}),
        (body(seed=6, lora_scale=0.5), {"lora": fixtures["kohya"], "accept": "image/png"}),
        (
            body(seed=7, width=128, height=64, guidance_scale=3.5, negative_prompt="dog"),
            {"lora": fixtures.local["peft"]},
        ),
        ('{"inputs": "a fox"', {}),
        ('{"inputs": "a", "parameters": {"steps": 4}}', {}),
        (body(steps=9999), {}),
        (body(), {"lora": "fixtures/no-such-lora"}),
        (body(), {"lora": fixtures["gated"]}),
        (body(), {"lora": fixtures["sd15"]}),
        (body(), {"lora": "https://example.com/x.safetensors"}),
        ('{"inputs": "' + "a" * 70_000 + '"}', {}),
    ]
    for content, headers in cases:
        expected, got = post(single, content, **headers), post(cluster, content, **headers)
        assert_same_answer(got, expected, headers)
        for name in CONTRACT_HEADERS:
            assert got.headers.get(name) == expected.headers.get(name), (name, headers)
        assert (got.headers.get("x-timing") is None) == (expected.headers.get("x-timing") is None)
    unserved = post(cluster + "models/someone/other-base", body())
    assert unserved.status_code == 404
    assert unserved.json()["error_type"] == "UnservedBaseError"
    assert "served: stabilityai/stable-diffusion-xl-base-1.0" in unserved.json()["error"]
    named = post(cluster + "models/stabilityai/stable-diffusion-xl-base-1.0", body(seed=5), lora=fixtures["peft"])
    assert_same_answer(named, post(single, body(seed=5), lora=fixtures["peft"]), "named base")


def test_the_gradio_api_and_metrics_answer_as_one_process_does(cluster, cluster_settings, loaded, hub, fixtures):
    from gradio_client.exceptions import AppError

    from tests.support.reliability_app import CLIENT_GENERATE

    good = CLIENT_GENERATE | {"lora": fixtures["peft"]}
    bad = CLIENT_GENERATE | {"steps": 9999}
    with serve_fixture_app(loaded, cluster_settings, hub, fixtures, metrics=True) as app:
        answers = {}
        for url in (app.url, cluster):
            client = api_client(url, verbose=False)
            image, info = client.predict(**good, api_name="/generate")
            with pytest.raises(AppError) as refused:
                client.predict(**bad, api_name="/generate")
            scrape = httpx.get(url.rstrip("/") + "/metrics", timeout=TIMEOUT).text
            answers[url] = (image, info, str(refused.value), scrape)
    (image, info, refused, scrape), (got_image, got_info, got_refused, got_scrape) = answers.values()
    assert_images_close(Path(got_image).read_bytes(), Path(image).read_bytes(), "gradio_client /generate")
    # The same LoRA file at the same scale (a replica may hold it cached from an earlier test: `cache` differs).
    files = [{k: v for k, v in use.items() if k != "cache"} for use in (*got_info["loras"], *info["loras"])]
    assert got_info["seed"] == info["seed"] and files[: len(files) // 2] == files[len(files) // 2 :]
    assert got_refused == refused and "steps=9999" in refused

    def families(text: str) -> set[str]:
        return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}

    def counted(text: str) -> list[str]:
        return sorted(
            line
            for line in text.splitlines()
            if line.startswith("switchboard_requests_total{") and 'transport="gradio_api"' in line
        )

    assert families(got_scrape) == families(scrape)
    assert counted(got_scrape) == counted(scrape) and len(counted(scrape)) == 2  # one 200, one 400


def test_a_repeated_adapter_lands_on_the_replica_that_holds_it(cluster, fixtures):
    homes: dict[str, str] = {}
    for round_ in range(3):
        for role in ("second", "peft-noalpha"):
            response = post(cluster, body(seed=round_), lora=fixtures[role])
            assert response.status_code == 200, response.text[:300]
            replica = response.headers["x-replica"]
            if round_ == 0:
                homes[role] = replica
                continue
            assert replica == homes[role], (role, round_)
            assert response.headers["x-lora-cache"] == f"{fixtures[role]}=hit"


def test_ours_prefers_the_replica_holding_the_set_and_does_not_pile_onto_it(cluster, fixtures):
    lora = fixtures["peft-noalpha"]
    holder = post(cluster, body(seed=20), lora=lora).headers["x-replica"]
    assert post(cluster, body(seed=21), lora=lora).headers["x-replica"] == holder  # idle: the holder
    # Six at once for the one set: queueing them all on its holder costs more than loading it on the other.
    answers = at_once(6, lambda i: post(cluster, body(seed=30 + i, steps=8), lora=lora))
    assert [a.status_code for a in answers] == [200] * 6
    served = [a.headers["x-replica"] for a in answers]
    assert holder in served and len(set(served)) == 2, served


def test_a_replica_that_stops_answering_its_stats_is_routed_around(cluster, cluster_settings, fixtures):
    lora = fixtures["second"]
    victim = post(cluster, body(seed=50), lora=lora).headers["x-replica"]
    actor = ray.get_actor(replica_actor(cluster_settings, victim), namespace="serve")
    pid = ray.get(actor.is_allocated.remote())[0]  # Serve's replica actor: its process id first
    os.kill(pid, signal.SIGSTOP)  # it answers nothing now: neither Serve's stats calls nor requests
    try:
        # Staleness is a time on the front end's clock in another process (no clock to inject there): the victim,
        # stopped, sends nothing, so its last report is old by at least this much once it has passed. Polling by
        # requests instead would hang one on the stopped victim whenever it still looked fresh.
        time.sleep(router_kwargs(cluster_settings)["stale_after_s"] + 2 * cluster_settings.cluster_stats_period_s)
        # The victim holds the set (it would win when fresh): the request goes to the other replica instead.
        rerouted = post(cluster, body(seed=51), lora=lora)
        assert rerouted.status_code == 200 and rerouted.headers["x-replica"] != victim
    finally:
        os.kill(pid, signal.SIGCONT)

    def both_used() -> bool:  # back once its report is fresh again: two at once use both replicas
        pair = at_once(2, lambda i: post(cluster, body(seed=52 + i, steps=8), lora=lora))
        return victim in {answer.headers["x-replica"] for answer in pair}

    wait_until(both_used, "the replica that answers its stats again routed to again", poll=1.0)


def test_the_router_is_a_setting_and_both_policies_run_on_one_cluster(cluster, cluster_settings, fixtures):
    serves = cluster_settings.replace(cluster_router="ray_multiplexed", cluster_replicas=1)
    serve.run(build_app(serves), name="multiplexed", route_prefix="/multiplexed")
    try:
        details = serve.context._get_global_client().get_serve_details()["applications"]
        routers = {
            app: details[app]["deployments"][pool_deployment(cluster_settings)]["deployment_config"][
                "request_router_config"
            ]["request_router_class"]
            for app in (APP, "multiplexed")
        }
        assert routers == {APP: ROUTER_CLASS, "multiplexed": DEFAULT_REQUEST_ROUTER_PATH}
        request = GenerateRequest(prompt="a fox", loras=(LoraSpec(fixtures["peft"]),), seed=5, steps=2)
        results = []
        for app in (APP, "multiplexed"):
            handle = serve.get_deployment_handle(pool_deployment(cluster_settings), app_name=app)
            call = handle.options(multiplexed_model_id=adapter_set_id(request)).generate
            results.append(call.remote(request).result(timeout_s=300))
        assert_images_close(results[0].image, results[1].image, "one request under each router")
    finally:
        serve.delete("multiplexed")


def test_base_weights_are_bit_exact_on_every_replica_after_a_mixed_run(cluster, cluster_settings, fixtures):
    loras = [fixtures["peft"], fixtures["kohya"], fixtures.local["kohya"], fixtures["second"], "", fixtures["sd15"]]
    statuses: list[int] = []

    def client(offset: int) -> None:
        for i in range(6):
            lora = loras[(i + offset) % len(loras)]
            headers = {"lora": lora} if lora else {}
            statuses.append(
                post(cluster, body(seed=i, lora_scale=0.7) if lora else body(seed=i), **headers).status_code
            )

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert sorted(set(statuses)) == [200, 400]  # the SD 1.5 LoRA is refused, the rest served
    reference = weights_digest(load_pipeline(cluster_settings, warm=False).pipe)
    seen = replica_weights(cluster_settings, expected=2)
    assert len(seen) == 2
    for replica, (digest, cached) in seen.items():
        assert digest == reference, replica
        # Serve's LRU holds at most 3 adapter sets of one LoRA each; the engine holds no more than those.
        assert len(cached) <= cluster_settings.cluster_adapter_sets, (replica, cached)


def test_the_space_with_backend_url_generates_on_the_cluster(cluster, cluster_settings, engine, fixtures):
    from engine.errors import GatedLoraError, LimitExceededError, SettingsError
    from engine.requests import GenerateRequest, LoraSpec
    from serving.backends import blocking
    from serving.backends.remote import RemoteBackend
    from serving.runtime import build_runtime

    def no_local_pipeline(*args: object, **kwargs: object):
        raise AssertionError("a front end loads no pipeline")

    runtime = build_runtime(cluster_settings.replace(backend_url=cluster.rstrip("/")), load=no_local_pipeline)
    try:
        request = GenerateRequest(
            prompt="a fox",
            loras=(LoraSpec(fixtures["peft"], 0.8), LoraSpec(fixtures.local["kohya"], 0.5)),
            seed=3,
            steps=2,
        )
        remote, local = generate(runtime.backend, request), generate(engine, request)
        assert_images_close(remote.image, local.image, "remote backend")
        assert remote.request == local.request
        assert [(a.ref, a.revision, a.weight_name, a.scale) for a in remote.adapters] == [
            (a.ref, a.revision, a.weight_name, a.scale) for a in local.adapters
        ]
        assert runtime.backend.pools()[0].defaults == engine.defaults
        assert (
            blocking(runtime.backend.check(LoraSpec(fixtures["second"]))).rank
            == engine.check_lora(LoraSpec(fixtures["second"])).rank
        )
        assert blocking(runtime.backend.status())[0].engine.model_id == cluster_settings.model_id
        with pytest.raises(GatedLoraError, match="gated"):
            generate(runtime.backend, GenerateRequest(prompt="x", loras=(LoraSpec(fixtures["gated"]),)))
        with pytest.raises(LimitExceededError, match="steps=9999"):
            generate(runtime.backend, GenerateRequest(prompt="x", steps=9999))
    finally:
        runtime.close()
    with pytest.raises(SettingsError, match="could not be reached"):
        RemoteBackend(f"http://127.0.0.1:{free_port()}", timeout_s=5)


def test_a_replica_killed_mid_run_is_replaced_and_no_request_is_lost(cluster, cluster_settings, single, fixtures):
    home = post(cluster, body(seed=1), lora=fixtures["kohya"]).headers["x-replica"]
    long_job = (body(seed=99, steps=50), fixtures["kohya"])  # a few seconds on the tiny pipeline: killed mid-way
    loras = [fixtures["peft"], fixtures["second"], fixtures.local["peft"], ""]
    jobs = [long_job, *[(body(seed=100 + i, steps=4), loras[i % len(loras)]) for i in range(12)]]
    answers: dict[int, httpx.Response] = {}

    def client(indices: list[int]) -> None:
        for i in indices:
            content, lora = jobs[i]
            answers[i] = post(cluster, content, **({"lora": lora} if lora else {}))

    threads = [threading.Thread(target=client, args=([0],))]
    threads += [threading.Thread(target=client, args=(list(range(k, len(jobs), 2)),)) for k in (1, 2)]
    actor = ray.get_actor(replica_actor(cluster_settings, home), namespace="serve")
    threads[0].start()

    def long_request_on_home() -> bool:
        # Serve's own count of the requests a replica has accepted and not answered (what its routers probe; its
        # actor answers it on a thread of its own, beside the running request): only the long one was sent yet.
        return ray.get(actor.get_num_ongoing_requests.remote(), timeout=30) >= 1

    wait_until(long_request_on_home, "the long request on its LoRA's home replica", 120, poll=0.05)
    for thread in threads[1:]:
        thread.start()
    ray.kill(actor, no_restart=True)
    for thread in threads:
        thread.join(600)
    assert sorted(answers) == list(range(len(jobs)))
    for i, (content, lora) in enumerate(jobs):
        expected = post(single, content, **({"lora": lora} if lora else {}))
        assert answers[i].status_code == 200, answers[i].text[:300]
        assert_same_answer(answers[i], expected, i)
    # The long request was answered by another replica: the front end sent it again after its replica died.
    assert answers[0].headers["x-replica"] != home
    wait_until(lambda: running_replicas(cluster_settings) >= 2, "the killed replica replaced", 300, poll=1.0)
    assert running_replicas(cluster_settings) == 2
    replicas = replica_weights(cluster_settings, expected=2)
    assert home not in replicas
