"""A LoRA's strength by step through the cluster without Ray (issue 51, "every door"): `parameters.loras[i]`'s
`schedule` and its short form `start`/`end`, posted to the ingress's `POST /` (the Ray handle path) and to a
`BACKEND_URL` front end (`RemoteBackend` sending the wire's `/v1/generate` to the ingress), answer the image bytes a
single process's `POST /` answers, the replica receiving the schedule as sent; a bad schedule is the same 400 at
every door, naming what is accepted."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from engine.requests import LoraSpec
from serving.backends.local import LocalBackend
from serving.backends.remote import RemoteBackend
from tests.support.app_server import serve_asgi, serve_routes
from tests.support.serve_handles import ReplicaHandle, front_end, replica_of, stand_in_ray

SIZE = {"num_inference_steps": 4, "guidance_scale": 5.0, "width": 64, "height": 64, "seed": 9}
DOORS = ("ingress", "backend_url")


@pytest.fixture
def doors(make_engine, base_settings, monkeypatch) -> Iterator[tuple[dict[str, str], ReplicaHandle]]:
    """The base URL of each door over one engine (the same weights in the same storage: the same bytes), and the
    replica's handle."""
    stand_in_ray(monkeypatch)
    engine = make_engine()
    handle = ReplicaHandle(replica_of(engine))
    ingress, _ = front_end([handle], base_settings)
    with (
        serve_routes(LocalBackend.of(engine)) as single,
        serve_asgi(ingress) as (cluster, _),
        serve_routes(RemoteBackend(cluster.rstrip("/"), timeout_s=300)) as remote,
    ):
        yield {"single": single, "ingress": cluster, "backend_url": remote}, handle


def post(url: str, lora: dict) -> httpx.Response:
    document = {"inputs": "a fox in a forest", "parameters": {**SIZE, "loras": [lora]}}
    return httpx.post(url, json=document, headers={"accept": "image/png"}, timeout=300)


def answered(url: str, lora: dict) -> bytes:
    response = post(url, lora)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"] == "image/png"
    return response.content


@pytest.mark.timeout(900)
def test_a_schedule_and_its_short_form_through_the_cluster_are_a_single_processs_bytes(doors, fixtures):
    urls, handle = doors
    peft = fixtures["peft"]
    long = {"path": peft, "schedule": [[0, 0.0], [0.5, 2.0]]}
    short = {"path": peft, "scale": 2.0, "start": 0.5}
    single = answered(urls["single"], long)
    assert answered(urls["single"], short) == single, "the short form is the same checked request"
    # The schedule is in force: the LoRA at its step-0 scale on every step is another image.
    assert answered(urls["single"], {"path": peft, "scale": 0.0}) != single
    for door in DOORS:
        for lora in (long, short):
            assert answered(urls[door], lora) == single, (door, lora)
    sent = [call[0].loras[0] for call in handle.generate.calls]
    assert [(s.schedule, s.start, s.end) for s in sent] == [(((0, 0.0), (0.5, 2.0)), None, None), ((), 0.5, None)] * 2
    assert sent[0] == LoraSpec(peft, schedule=((0, 0.0), (0.5, 2.0)))


def test_a_bad_schedule_is_the_same_400_at_every_cluster_door(doors, fixtures):
    urls, _ = doors
    bad = {"path": fixtures["peft"], "schedule": [[0, 1.0], [0.5, 0.0], [0.25, 1.0]]}
    single = post(urls["single"], bad)
    assert single.status_code == 400
    said = single.json()["error"]
    assert "not increasing; accepted: a list of [from, scale] pairs" in said
    for door in DOORS:
        refused = post(urls[door], bad)
        assert (refused.status_code, refused.json()["error"]) == (400, said), door
