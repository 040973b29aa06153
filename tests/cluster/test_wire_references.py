"""Reference images through the cluster without Ray: a request with three further references, each at exactly
MAX_INPUT_PIXELS, crosses the wire (`request_to_json`, what a `BACKEND_URL` front end sends) to the ingress's
`/v1/generate`, reaches the tiny FLUX.2 [klein] pool's replica in order and comes back as the engine's own image;
one a pixel over the limit is refused from its header with the same 4xx and message as `POST /` gives for it,
before any replica. A pool's reference sizing (`ReferenceFit`) crosses in its defaults. Count, then decode: the
ingress counts the references before reading a header, and the check refuses a count past the pool's before
decoding any. The client's own files cross (six photo JPEGs: about their bytes and base64's third, not PNGs of
their pixels), reach the replica as those bytes and come back with the checked request."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image

import engine.images
import serving.cluster.wire_media
from engine.images import DEFAULT_MAX_INPUT_PIXELS, InputImage, encoded_image
from engine.outcomes import ServedPool
from engine.requests import GenerateRequest
from families.flux2 import MODEL_ID as KLEIN
from serving.cluster.wire import decode_png, pools_from_json, pools_to_json, request_from_json, request_to_json
from serving.http.body import parse_body
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


def decoded(images: tuple) -> tuple[InputImage, ...]:
    """Files a door carried (the replica's check decodes them), as their pixels."""
    return tuple(image.decoded(LIMIT) for image in images)


def noise_jpeg(width: int, height: int, seed: int) -> bytes:
    """A photo-like JPEG: noise, as a camera's detail is to a compressor (quality 90)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


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
    assert decoded(request_from_json(document, max_pixels=LIMIT).images) == request.images
    answer = test_client.post("/v1/generate", json=document)
    assert answer.status_code == 200, answer.text[:300]
    (sent,) = handle.generate.calls
    assert decoded(sent[0].images) == request.images, "the references reach the replica in order, pixel for pixel"
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


def test_the_wire_counts_the_references_before_reading_any_header_or_decoding_any(cluster, monkeypatch):
    test_client, handle = cluster
    headers: list[str] = []
    monkeypatch.setattr(serving.cluster.wire_media, "encoded_image", lambda data, **kw: headers.append(kw["what"]))

    def decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was decoded before the request was counted")

    monkeypatch.setattr(engine.images, "decode_image", decode)
    sixty = request_to_json(edit(*[(64, 64)] * 60))
    wire = test_client.post("/v1/generate", json=sixty)
    assert (wire.status_code, wire.json()["error_type"]) == (400, "LimitExceededError"), wire.text[:300]
    assert "61 images were given (the image and 60 images in images); no pool takes more than 16" in wire.text
    assert headers == [], "refused by its count before a header was read"
    monkeypatch.undo()
    monkeypatch.setattr(engine.images, "decode_image", decode)
    # Within what any pool takes, past klein's 4: the check counts them from their headers, decoding none.
    five = test_client.post("/v1/generate", json=request_to_json(edit(*[(64, 64)] * 4)))
    assert (five.status_code, five.json()["error_type"]) == (400, "LimitExceededError"), five.text[:300]
    assert "5 images were given (the image and 4 images in images); this pool's model takes at most 4" in five.text
    assert handle.generate.calls == [], "refused before any replica"


def test_six_photo_references_cross_the_wire_as_the_clients_own_bytes():
    """The issue's six photos: as PNGs of their pixels they made a 41.3 MiB body of a 6.4 MiB request. Through
    a front end's door (`POST /`) and onto the wire, they cross as their JPEGs in base64."""
    photos = [noise_jpeg(1024, 768, seed) for seed in range(6)]
    b64 = [base64.b64encode(photo).decode("ascii") for photo in photos]
    body = {"inputs": b64[0], "parameters": {"prompt": PROMPT, "images": b64[1:]}}
    request = parse_body(json.dumps(body).encode(), lora=None, accept=None).request
    wire = json.dumps(request_to_json(request))
    own = sum(len(photo) for photo in photos)
    as_png = sum(len(base64.b64encode(png_bytes(Image.open(io.BytesIO(photo))))) for photo in photos)
    assert len(wire) <= own * 4 / 3 + 2048, f"{len(wire)} characters for {own} bytes of JPEG"
    assert as_png > 2.5 * len(wire), "PNGs of the pixels: what crossed before"
    back = request_from_json(json.loads(wire), max_pixels=DEFAULT_MAX_INPUT_PIXELS)
    assert back == request and [image.data for image in (back.image, *back.images)] == photos


def test_jpeg_references_reach_the_replica_as_their_files_and_give_the_local_result(cluster, klein_engine):
    test_client, handle = cluster
    photos = [noise_jpeg(64, 64, seed) for seed in range(4)]
    files = [encoded_image(photo, what=f"image {n}", max_pixels=LIMIT) for n, photo in enumerate(photos, 1)]
    request = GenerateRequest(prompt=PROMPT, steps=2, width=64, height=64, seed=7, image=files[0], images=(*files[1:],))
    answer = test_client.post("/v1/generate", json=request_to_json(request))
    assert answer.status_code == 200, answer.text[:300]
    (sent,) = handle.generate.calls
    assert [image.data for image in (sent[0].image, *sent[0].images)] == photos, "the client's own bytes"
    # The checked request comes back with the same files (what its pixels were decoded from).
    returned = answer.json()["result"]["request"]
    assert [base64.b64decode(image["file"]) for image in (returned["image"], *returned["images"])] == photos
    expected = generate(klein_engine, request)
    with Image.open(io.BytesIO(decode_png(answer.json()["image"]))) as image:
        assert image.convert("RGB").tobytes() == expected.image.convert("RGB").tobytes()
