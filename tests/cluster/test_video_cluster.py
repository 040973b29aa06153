"""The tiny Wan pool's video through the cluster without Ray: its replica sends the MP4 it made (not its frames),
and both the ingress's `POST /` (the Ray handle path) and a `BACKEND_URL` front end reading `/v1/generate` (the
HTTP wire) answer the MP4 a single process answers for the same request, byte for byte; an animated WebP asked
for by Accept is made from that MP4's decoded frames, the same count."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from engine.requests import GenerateRequest, GenerateResult
from serving.cluster.answers import answer_from_json
from serving.cluster.wire import request_to_json
from serving.recipes import with_recipes
from serving.video import decode_mp4, frame_count, video_file
from tests.support.checks import generate
from tests.support.dit import local_engine
from tests.support.serve_handles import ReplicaHandle, client, front_end, replica_of, stand_in_ray

PROMPT, SEED, STEPS, FRAMES = "a fox running through snow", 5, 2, 5
BODY = {"inputs": PROMPT, "parameters": {"num_inference_steps": STEPS, "seed": SEED, "num_frames": FRAMES}}


@pytest.fixture(scope="module")
def wan_engine(loaded_wan, tiny_wan_dir, base_settings) -> Iterator[Any]:
    settings = base_settings.replace(model_id=str(tiny_wan_dir), base_model_id=loaded_wan.base_model_id)
    with local_engine(loaded_wan, settings) as engine:
        yield engine


@pytest.fixture
def cluster(wan_engine, monkeypatch) -> Iterator[tuple[Any, ReplicaHandle]]:
    stand_in_ray(monkeypatch)
    handle = ReplicaHandle(replica_of(wan_engine))
    app, _ = front_end([handle], wan_engine.settings)
    for made in client(app):
        yield made, handle


@pytest.fixture(scope="module")
def made(wan_engine) -> GenerateResult:
    return generate(wan_engine, GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=FRAMES))


@pytest.fixture(scope="module")
def single(made) -> bytes:
    """What one process's doors answer for the request: `Handlers` adds the recipe, `video_file` encodes."""
    return video_file(with_recipes(made))


def test_the_ingress_and_a_backend_url_front_end_answer_a_single_process_mp4(cluster, single):
    test_client, _ = cluster
    posted = test_client.post("/", json=BODY)
    assert posted.status_code == 200, posted.text[:300]
    assert posted.headers["content-type"] == "video/mp4"
    assert posted.content == single, "the ingress answers the replica's MP4, a single process's bytes"
    request = GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=FRAMES)
    wired = test_client.post("/v1/generate", json=request_to_json(request))
    assert wired.status_code == 200, wired.text[:300]
    document = wired.json()
    assert "frames" not in document
    back = with_recipes(answer_from_json(json.loads(json.dumps(document))))
    assert video_file(back) == single, "a BACKEND_URL front end answers the same bytes"
    assert back.frames == () and frame_count(back) == len(decode_mp4(single).frames) == FRAMES


def test_an_animated_webp_by_accept_is_made_from_the_mp4s_frames(cluster):
    test_client, _ = cluster
    answer = test_client.post("/", json=BODY, headers={"accept": "image/webp"})
    assert answer.status_code == 200, answer.text[:300]
    assert answer.headers["content-type"] == "image/webp"
    webp = Image.open(io.BytesIO(answer.content))
    assert webp.format == "WEBP" and webp.n_frames == FRAMES


def test_the_replica_sends_the_mp4_not_the_frames(wan_engine, single, monkeypatch):
    stand_in_ray(monkeypatch)
    request = GenerateRequest(prompt=PROMPT, steps=STEPS, seed=SEED, num_frames=FRAMES)
    sent = asyncio.run(replica_of(wan_engine).generate(request))
    assert sent.frames == () and sent.video == single and sent.served_by == "replica-1"


def test_an_ingress_with_recipes_off_answers_a_single_process_mp4_without_the_replicas_recipe(
    wan_engine, made, monkeypatch
):
    """The replica packs its recipe (its RECIPES on); the ingress's RECIPES=0 takes it out of the MP4 it answers,
    which is then what one process with RECIPES=0 answers, byte for byte (`video_file` without `with_recipes`)."""
    stand_in_ray(monkeypatch)
    app, _ = front_end([ReplicaHandle(replica_of(wan_engine))], wan_engine.settings.replace(recipes=False))
    for test_client in client(app):
        posted = test_client.post("/", json=BODY)
        assert posted.status_code == 200, posted.text[:300]
        assert decode_mp4(posted.content).comment is None
        assert posted.content == video_file(made)
