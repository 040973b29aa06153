"""Editing from several reference images end to end, on a tiny FLUX.2 [klein] pool (the shared app serves only
SDXL, whose pool takes one image): `POST /` with `parameters.images`, huggingface_hub's InferenceClient with
`extra_body={"images": [...]}` and gradio_client's /generate with `images` give the same bytes as the engine run
directly, each answer's warnings (`X-Warnings`, the info dict) naming the reference the pipeline cropped and both
sizes, which are the sizes diffusers' own call read it at; swapping two references swaps what the call reads
and the recipe's order; four HTTP clients mixing the klein pool and SDXL's at
once each get the bytes their request gets alone."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client, handle_file
from huggingface_hub import InferenceClient
from PIL import Image

from engine.images import InputImage
from engine.requests import GenerateRequest, GenerateResult
from families.flux2 import MODEL_ID as KLEIN
from families.sdxl import MODEL_ID as SDXL
from serving.recipes import image_hash, parse_recipe, recipe_text
from tests.support.app_server import AppServer, serve_fixture_app, serve_routes
from tests.support.checks import backend_of
from tests.support.clients import api_client
from tests.support.dit import hub_pools, response_image
from tests.support.image_inputs import example_image, png_bytes
from tests.support.mixed import assert_clients_get_what_they_get_alone

PROMPT = "the fox of image 1 in the forest of image 2, lit as image 3"
# The first image, then two references: the second of sides that are no multiple of klein's 4 (the tiny VAE's
# scale of 2 times the 2x2 patches), which its call center-crops to 68x64.
FIRST, SECOND, THIRD = example_image(64, 64, 0), example_image(64, 64, 1), example_image(70, 66, 2)
CROPPED = "image 3 (images[1]) is 70x66: the pipeline reads it at 68x64 (center-cropped to sides in multiples of 4)"
PNG = {"accept": "image/png"}


def b64(image: Image.Image) -> str:
    return base64.b64encode(png_bytes(image)).decode("ascii")


def edit(first: Image.Image = FIRST, *references: Image.Image, seed: int = 7) -> GenerateRequest:
    """The request every door sends: two steps at 64 px, seed 7, the first image and its references in order."""
    return GenerateRequest(
        prompt=PROMPT,
        steps=2,
        width=64,
        height=64,
        seed=seed,
        image=InputImage.from_pil(first),
        images=tuple(InputImage.from_pil(r) for r in references),
    )


def body(first: Image.Image, *references: Image.Image, seed: int = 7) -> bytes:
    """`edit`'s request as `POST /`'s JSON: the first image as `inputs`, base64 and data-URL references."""
    images = [b64(r) if i % 2 == 0 else f"data:image/png;base64,{b64(r)}" for i, r in enumerate(references)]
    parameters = {"prompt": PROMPT, "num_inference_steps": 2, "seed": seed, "images": images}
    parameters["target_size"] = {"width": 64, "height": 64}
    return json.dumps({"inputs": b64(first), "parameters": parameters}).encode()


def direct(engine: Any, request: GenerateRequest) -> GenerateResult:
    """The engine's own run, without a backend or a transport."""
    with engine.prepare(request) as prepared:
        return engine.run(prepared)


def rgb(image: Image.Image) -> bytes:
    return image.convert("RGB").tobytes()


@pytest.fixture(scope="module")
def klein_app(loaded_flux2, tiny_flux2_dir: Path, base_settings, hub, fixtures) -> Iterator[AppServer]:
    settings = base_settings.replace(model_id=str(tiny_flux2_dir), base_model_id=KLEIN)
    with serve_fixture_app(loaded_flux2, settings, hub, fixtures) as served:
        yield served


@pytest.fixture(scope="module")
def klein_client(klein_app: AppServer) -> Client:
    return api_client(klein_app.url, verbose=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("references")
    paths = []
    for index, image in enumerate((FIRST, SECOND, THIRD)):
        path = folder / f"image{index + 1}.png"
        image.save(path)
        paths.append(str(path))
    return paths


def test_http_inference_client_and_gradio_client_give_the_engines_own_edit_from_three_images(
    klein_app, klein_client, files
):
    ours = direct(klein_app.engine, edit(FIRST, SECOND, THIRD))
    assert len(ours.request.images) == 2 and ours.request.mode == "image-to-image"
    assert CROPPED in ours.warnings, ours.warnings
    expected = rgb(ours.image)

    answer = httpx.post(klein_app.url, content=body(FIRST, SECOND, THIRD), headers=PNG, timeout=300)
    assert answer.status_code == 200, answer.text[:300]
    assert response_image(answer) == expected
    assert json.loads(answer.headers["X-Warnings"]) == list(ours.warnings)
    http_recipe = Image.open(io.BytesIO(answer.content)).info["parameters"]
    recipe = parse_recipe(http_recipe).parameters
    hashes = [image_hash(InputImage.from_pil(i)) for i in (FIRST, SECOND, THIRD)]
    assert recipe["Reference images"] == "3"
    assert recipe["Reference hashes"] == ", ".join(f"image {i + 1}: {h}" for i, h in enumerate(hashes))

    hf = InferenceClient(model=klein_app.url, headers=PNG, timeout=300)
    extra = {"images": [b64(SECOND), b64(THIRD)], "seed": 7}
    made = hf.image_to_image(
        png_bytes(FIRST), prompt=PROMPT, num_inference_steps=2, target_size={"width": 64, "height": 64},
        extra_body=extra,
    )  # fmt: skip
    assert rgb(made) == expected

    path, info = klein_client.predict(
        prompt=PROMPT, steps=2, guidance=1.0, width=64, height=64, seed=7,
        image=handle_file(files[0]), images=[handle_file(files[1]), handle_file(files[2])],
        api_name="/generate",
    )  # fmt: skip
    with Image.open(path) as image:
        assert rgb(image) == expected
        assert image.info["parameters"] == http_recipe
    assert info["warnings"] == list(ours.warnings)


def test_a_cropped_reference_is_warned_with_the_size_diffusers_call_read_it_at(klein_app, monkeypatch):
    """The warning's sizes are what Flux2KleinPipeline's own preprocessing was asked for, image by image."""
    processor = klein_app.engine.loaded.pipe.image_processor
    read: list[tuple[tuple[int, int], tuple[int, int]]] = []
    original = processor.preprocess

    def spy(image: Any, height: int | None = None, width: int | None = None, **kwargs: Any) -> Any:
        read.append((image.size, (width, height)))
        return original(image, height=height, width=width, **kwargs)

    monkeypatch.setattr(processor, "preprocess", spy)
    result = direct(klein_app.engine, edit(FIRST, THIRD, SECOND))
    assert read == [((64, 64), (64, 64)), ((70, 66), (68, 64)), ((64, 64), (64, 64))]
    cropped = CROPPED.replace("image 3 (images[1])", "image 2 (images[0])")
    assert [w for w in result.warnings if "the pipeline reads it" in w] == [cropped]
    # References at the pool's multiple (and within 1 MP) are read as sent: nothing to say.
    assert not [w for w in direct(klein_app.engine, edit(FIRST, SECOND)).warnings if "reads it" in w]


@pytest.mark.timeout(900)
def test_four_http_clients_mixing_a_reference_pool_and_sdxl_each_get_their_own_image(
    loaded, loaded_flux2, base_settings, clean_hub, fixtures
):
    pipelines = [(loaded, SDXL), (loaded_flux2, KLEIN)]
    seconds = (SECOND, THIRD, example_image(80, 64, 3), example_image(64, 64, 4))
    work: list[tuple[str, bytes]] = []
    for index in range(8):
        if index % 2:
            sdxl = {"inputs": PROMPT, "parameters": {"num_inference_steps": 2, "seed": index, "guidance_scale": 5}}
            work.append((SDXL, json.dumps(sdxl).encode()))
        else:
            references = (seconds[index // 2], seconds[(index // 2 + 1) % 4])[: 1 + index % 4 // 2]
            work.append((KLEIN, body(FIRST, *references, seed=index)))
    with (
        hub_pools(pipelines, base_settings, clean_hub.url, fixtures.local_dir) as pools,
        serve_routes(backend_of(pools)) as url,
    ):

        def answer(index: int) -> bytes:
            base, content = work[index]
            response = httpx.post(f"{url}models/{base}", content=content, headers=PNG, timeout=300)
            assert response.status_code == 200, response.text[:300]
            return response_image(response)

        alone = assert_clients_get_what_they_get_alone(answer, len(work), clients=4)
    assert len(set(alone)) == len(alone), "each request makes an image of its own"


@pytest.mark.parametrize(
    ("size", "why"), [((66, 50), "66x50, under this pool's 64 px"), ((600, 64), "600x64, an aspect ratio over")]
)
def test_a_reference_the_pipeline_would_refuse_is_a_400_naming_it_not_a_failed_run(klein_app, size, why):
    """FLUX.2's call refuses a side under 64 px or a ratio over 8:1 (`check_image_input`): a 500 before."""
    applied = klein_app.engine.status().applied
    answer = httpx.post(klein_app.url, content=body(FIRST, SECOND, example_image(*size)), headers=PNG, timeout=300)
    assert answer.status_code == 400, answer.text[:300]
    assert f"image 3 (images[1]) is {why}" in answer.json()["error"], answer.json()
    assert "accepted: images of sides 64 px or more, at most 8:1" in answer.json()["error"]
    assert klein_app.engine.status().applied == applied


def test_swapping_two_references_swaps_what_the_pipeline_reads_and_the_recipe_says_which_order_ran(
    klein_app, monkeypatch
):
    """The tiny pipelines barely read a small reference (swapping two moves the tiny klein's and the tiny
    Qwen-Image-Edit-2509's image by 1 level, at 2 or 4 steps, with noise, black/white or red/blue references), so
    the order is shown where diffusers' call reads the images: each one's hash, in the order its preprocessing got
    them; the images differ, and each recipe lists the order that ran."""
    processor = klein_app.engine.loaded.pipe.image_processor
    original, read = processor.preprocess, []

    def spy(image: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(image_hash(InputImage.from_pil(image)))
        return original(image, *args, **kwargs)

    monkeypatch.setattr(processor, "preprocess", spy)
    hashes = [image_hash(InputImage.from_pil(image)) for image in (FIRST, SECOND, THIRD)]
    runs = []
    for order in ((SECOND, THIRD), (THIRD, SECOND)):
        read.clear()
        result = direct(klein_app.engine, edit(FIRST, *order))
        sent = [image_hash(InputImage.from_pil(image)) for image in (FIRST, *order)]
        assert read == sent and sorted(sent) == sorted(hashes)
        recipe = parse_recipe(recipe_text(result)).parameters
        assert recipe["Reference hashes"] == ", ".join(f"image {i + 1}: {h}" for i, h in enumerate(sent))
        runs.append(result.image.tobytes())
    assert runs[0] != runs[1], "the order of the references changes the image"
