"""`GET /metrics` on the launched app (METRICS=1): scraped and read with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.testclient import TestClient

from engine.pipeline.sharing import scheduler_for
from engine.pipeline.stepshare import DeviceScheduler
from engine.requests import GenerateRequest, LoraSpec
from serving.backends.local import LocalBackend
from serving.handlers import Handlers
from serving.http.api import http_routes
from serving.http.metrics import Metrics
from tests.support.app_server import AppServer
from tests.support.checks import generate
from tests.support.reliability_app import fresh_repo
from tests.support.stepshare import Rivals

TIMEOUT = httpx.Timeout(120.0)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample by (sample name, sorted labels), read by prometheus_client's parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(server: AppServer) -> Samples:
    response = httpx.get(server.url + "metrics", timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def api_generate(client: Client, lora: str) -> None:
    client.predict(
        prompt="a fox",
        negative_prompt="",
        lora=lora,
        lora_scale=1.0,
        lora_2="",
        lora_2_scale=1.0,
        steps=2,
        guidance=5.0,
        width=64,
        height=64,
        seed=3,
        api_name="/generate",
    )


def post(server: AppServer, body: str, **headers: str) -> httpx.Response:
    return httpx.post(server.url, content=body, headers=headers, timeout=TIMEOUT)


BODY = json.dumps({"inputs": "a fox", "parameters": {"num_inference_steps": 2, "width": 64, "height": 64}})


def test_the_families_the_issue_asks_for_are_exposed(server):
    families = {f.name: f.type for f in text_string_to_metric_families(httpx.get(server.url + "metrics").text)}
    expected = {
        "switchboard_requests": "counter",
        "switchboard_queue_length": "gauge",
        "switchboard_queue_wait_seconds": "histogram",
        "switchboard_prepare_seconds": "histogram",
        "switchboard_swap_seconds": "histogram",
        "switchboard_inference_seconds": "histogram",
        "switchboard_cache_hits": "counter",
        "switchboard_cache_misses": "counter",
        "switchboard_cache_evictions": "counter",
        "switchboard_cache_bytes": "gauge",
        "switchboard_hub_errors": "counter",
        "switchboard_active_adapters": "gauge",
    }
    assert expected.items() <= families.items()


def test_counts_move_as_requests_are_made(server, client, fixtures, clean_hub):
    lora = fresh_repo(clean_hub, fixtures)  # never requested before, whichever test ran first on the shared app
    before = scrape(server)

    # Through gradio_client's named API: the LoRA is not cached yet (a host miss), then swapped in.
    api_generate(client, lora)
    first = scrape(server)
    assert moved(before, first, "switchboard_requests_total", transport="gradio_api", status="200") == 1
    assert moved(before, first, "switchboard_cache_misses_total", tier="host") == 1
    assert moved(before, first, "switchboard_cache_hits_total", tier="host") == 0
    for histogram in ("prepare", "queue_wait", "swap", "inference"):
        assert moved(before, first, f"switchboard_{histogram}_seconds_count") == 1, histogram
    assert value(first, "switchboard_active_adapters") == 1
    assert value(first, "switchboard_cache_bytes", tier="host") > 0
    assert value(first, "switchboard_queue_length") == 0

    # The same LoRA over POST /: a host hit, and no swap (it is fused already).
    response = post(server, BODY, lora=lora)
    assert response.status_code == 200, response.text[:300]
    second = scrape(server)
    assert moved(first, second, "switchboard_requests_total", transport="http", status="200") == 1
    assert moved(first, second, "switchboard_cache_hits_total", tier="host") == 1
    assert moved(first, second, "switchboard_cache_misses_total", tier="host") == 0
    assert moved(first, second, "switchboard_swap_seconds_count") == 0
    assert moved(first, second, "switchboard_inference_seconds_count") == 1

    # Errors, counted under their status: a bad body (400), a missing LoRA over the API (404),
    # and a Hub that is down (503, and a Hub error).
    assert post(server, '{"inputs": 3}').status_code == 400
    with pytest.raises(AppError):
        api_generate(client, "switchboard-tests/no-such-lora")
    # A repo never downloaded: one already in the Hub cache is served from disk while the Hub is down.
    unseen = fresh_repo(clean_hub, fixtures)
    clean_hub.set_fault("down")
    response = post(server, BODY, lora=unseen)
    clean_hub.set_fault(None)
    assert response.status_code == 503, response.text[:300]
    third = scrape(server)
    assert moved(second, third, "switchboard_requests_total", transport="http", status="400") == 1
    assert moved(second, third, "switchboard_requests_total", transport="gradio_api", status="404") == 1
    assert moved(second, third, "switchboard_requests_total", transport="http", status="503") == 1
    assert moved(second, third, "switchboard_hub_errors_total", error_type="HubUnavailableError") == 1
    # A failed request changes nothing that is served.
    assert value(third, "switchboard_active_adapters") == 1
    assert moved(second, third, "switchboard_inference_seconds_count") == 0


def test_metrics_are_served_only_when_turned_on(engine):
    handlers = Handlers(LocalBackend.of(engine), None, engine.settings)  # type: ignore[arg-type]
    assert "/metrics" not in {getattr(r, "path", None) for r in http_routes(handlers)}
    assert "/metrics" in {getattr(r, "path", None) for r in http_routes(handlers, metrics=True)}


def test_evictions_and_the_ui_transport_are_counted(make_engine, fixtures):
    # Sized from one prepared adapter: the cache holds one and a half, so a second LoRA evicts the first.
    probe = make_engine()
    generate(probe, GenerateRequest(prompt="a fox", loras=(LoraSpec(fixtures["peft"]),), steps=1, seed=1))
    one = probe.status().host_bytes
    probe.close()
    engine = make_engine(host_cache_bytes=one * 3 // 2)
    backend = LocalBackend.of(engine)
    metrics = Metrics(backend)
    handlers = Handlers(backend, None, engine.settings)  # type: ignore[arg-type]
    for ref in (fixtures["peft"], fixtures["second"]):
        request = GenerateRequest(prompt="a fox", loras=(LoraSpec(ref),), steps=1, width=64, height=64, seed=1)
        asyncio.run(handlers.generate(request, transport="ui"))
    samples = parse(scrape_routes(metrics))
    assert value(samples, "switchboard_requests_total", transport="ui", status="200") == 2
    assert value(samples, "switchboard_cache_misses_total", tier="host") == 2
    assert value(samples, "switchboard_cache_evictions_total", tier="host") == 1
    assert value(samples, "switchboard_cache_evicted_bytes_total", tier="host") == one
    assert value(samples, "switchboard_swap_seconds_count") == 2
    assert value(samples, "switchboard_cached_adapters") == 1
    assert value(samples, "switchboard_cache_bytes", tier="host") == engine.status().host_bytes
    assert value(samples, "switchboard_cache_budget_bytes", tier="host") == one * 3 // 2


def test_on_zero_gpu_the_workers_swap_and_inference_are_counted_once(make_engine, fixtures):
    # On ZeroGPU the run happens in a forked worker, whose events reach only the worker's copy of the observers:
    # stand in for it with a second engine over the same pipeline that nobody watches.
    engine, worker = make_engine(), make_engine()
    runner = LocalBackend.of(engine, zero_gpu=True)
    metrics = Metrics(runner)
    # The worker's side of a ZeroGPU call: its own backend receives what was shipped and runs its engine.
    in_worker = LocalBackend.of(worker, zero_gpu=True)
    runner._run_on_gpu = in_worker._run_shipped  # type: ignore[method-assign]
    request = GenerateRequest(prompt="a fox", loras=(LoraSpec(fixtures["peft"]),), steps=1, width=64, height=64, seed=1)
    result = generate(runner, request)
    samples = parse(scrape_routes(metrics))
    assert result.swapped
    assert value(samples, "switchboard_swap_seconds_count") == 1
    assert value(samples, "switchboard_swap_seconds_sum") == pytest.approx(result.timings.apply)
    assert value(samples, "switchboard_inference_seconds_count") == 1
    assert value(samples, "switchboard_prepare_seconds_count") == 1


def scrape_routes(metrics: Metrics) -> str:
    """`GET /metrics` as a scraper sends it (the levels are read from the backend then)."""
    with TestClient(Starlette(routes=metrics.routes())) as client:
        return client.get("/metrics").text


def test_the_device_s_sharing_is_counted_per_pool(make_engine):
    # Issue 48: device time per pool, pauses and paused seconds per run, the longest wait for a step; one pause
    # forced by a rival run at step 1 (it has less left: its one piece counts as nothing until measured).
    engine = make_engine(device_sharing="step")
    backend = LocalBackend.of(engine)
    metrics = Metrics(backend)
    scheduler = DeviceScheduler(first_guess_s=1e-9)
    rivals = Rivals(scheduler)
    with scheduler_for(torch.device("cpu"), scheduler):
        request = GenerateRequest(prompt="a fox", steps=3, width=64, height=64, seed=1)
        generate(engine, request, progress=rivals.at_steps({1}))
        rivals.join()
    samples = parse(scrape_routes(metrics))
    pool = engine.loaded.base_model_id
    assert value(samples, "switchboard_device_seconds_total", pool=pool) > 0
    assert value(samples, "switchboard_run_pauses_total", pool=pool) == 1
    assert value(samples, "switchboard_run_paused_seconds_count") == 1
    assert value(samples, "switchboard_run_paused_seconds_sum") > 0
    assert value(samples, "switchboard_step_wait_max_seconds_count") == 1
