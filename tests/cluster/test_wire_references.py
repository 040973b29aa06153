"""Reference images through the cluster without Ray: a request with three further references, each at exactly
MAX_INPUT_PIXELS, crosses the wire (`request_to_json`, what a `BACKEND_URL` front end sends) to the ingress's
`/v1/generate`, reaches the tiny FLUX.2 [klein] pool's replica in order and comes back as the engine's own image;
one a pixel over the limit is refused from its header with the same 4xx and message as `POST /` gives for it,
before any replica. A pool's reference sizing (`ReferenceFit`) crosses in its defaults."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from engine.images import InputImage
from engine.outcomes import ServedPool
from engine.requests import GenerateRequest
from families.flux2 import MODEL_ID as KLEIN
from serving.cluster.wire import decode_png, pools_from_json, pools_to_json, request_from_json, request_to_json
from tests.support.checks import generate
from tests.support.dit import local_engine
from tests.support.image_inputs import example_image, png_bytes
from tests.support.serve_handles import ReplicaHandle, client, front_end, replica_of, stand_in_ray

# The pixel limit: every image below is exactly this many pixels, or one column more.
LIMIT = 64 * 64
PROMPT = "the fox of image 1 with the hat of image 2, the scarf of image 3 and the sky of image 4"


def edit(*sizes: tuple[int, int]) -> GenerateRequest:
    """The first image at the limit, then references of `sizes`, each of its own seed; two steps, seed 7."""
    references = tuple(InputImage.from_pil(example_image(w, h, seed)) for seed, (w, h) in enumerate(sizes, 1))
    first = InputImage.from_pil(example_image(64, 64, 0))
    return GenerateRequest(prompt=PROMPT, steps=2, width=64, height=64, seed=7, image=first, images=references)


@pytest.fixture(scope="module")
def klein_engine(loaded_flux2, tiny_flux2_dir, base_settings) -> Iterator[Any]:
    settings = base_settings.replace(model_id=str(tiny_flux2_dir), base_model_id=KLEIN, max_input_pixels=LIMIT)
    with local_engine(loaded_flux2, settings) as engine:
        yield engine


@pytest.fixture
def cluster(klein_engine, monkeypatch) -> Iterator[tuple[Any, ReplicaHandle]]:
    stand_in_ray(monkeypatch)
    handle = ReplicaHandle(replica_of(klein_engine))
    app, _ = front_end([handle], klein_engine.settings)
    for made in client(app):
        yield made, handle


def test_three_references_at_the_pixel_limit_cross_the_wire_and_come_back_as_the_engines_own_image(
    cluster, klein_engine
):
    test_client, handle = cluster
    request = edit((64, 64), (64, 64), (64, 64))
    assert all(image.width * image.height == LIMIT for image in (request.image, *request.images))
    document = json.loads(json.dumps(request_to_json(request)))
    assert request_from_json(document, max_pixels=LIMIT) == request
    answer = test_client.post("/v1/generate", json=document)
    assert answer.status_code == 200, answer.text[:300]
    (sent,) = handle.generate.calls
    assert sent[0].images == request.images, "the references reach the replica in order, pixel for pixel"
    expected = generate(klein_engine, request)
    assert len(expected.request.images) == 3
    with Image.open(io.BytesIO(decode_png(answer.json()["image"]))) as image:
        assert image.convert("RGB").tobytes() == expected.image.convert("RGB").tobytes()


def test_a_reference_a_pixel_over_the_limit_is_the_same_4xx_on_the_wire_as_on_post(cluster):
    test_client, handle = cluster
    over = edit((64, 64), (65, 64), (64, 64))
    wire = test_client.post("/v1/generate", json=request_to_json(over))
    images = [base64.b64encode(png_bytes(image.to_pil())).decode() for image in over.images]
    parameters = {"prompt": PROMPT, "num_inference_steps": 2, "seed": 7, "images": images}
    first = base64.b64encode(png_bytes(over.image.to_pil())).decode()  # type: ignore[union-attr]
    post = test_client.post("/", json={"inputs": first, "parameters": parameters})
    for answer in (wire, post):
        assert (answer.status_code, answer.json()["error_type"]) == (400, "LimitExceededError"), answer.text[:300]
    # The same words after the name each door gives the field ("images[1]", "parameters.images[1]").
    said = [answer.json()["error"].partition("images[1] is ")[2] for answer in (wire, post)]
    assert said[0] == said[1] == f"65x64 (4160 pixels); accepted: at most {LIMIT} pixels (MAX_INPUT_PIXELS)"
    assert handle.generate.calls == [], "refused before any replica"


def test_a_pools_reference_sizing_crosses_in_its_defaults(klein_engine):
    pool = ServedPool(KLEIN, KLEIN, "flux2", klein_engine.defaults, False)
    (back,) = pools_from_json(json.loads(json.dumps(pools_to_json((pool,)))))
    assert back.defaults.reference_fit == klein_engine.defaults.reference_fit is not None
    assert back == pool
