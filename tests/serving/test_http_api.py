"""The inference-API-style endpoint (`POST /` with a `lora` header), exercised over HTTP like the curl line."""

from __future__ import annotations

import io
import queue
import re
import threading
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from engine.errors import GenerationCancelledError, InvalidRequestError
from engine.requests import GenerateRequest, LoraSpec
from serving.http.api import parse_body
from tests.support.app_server import free_port, recording_backend, serve_routes
from tests.support.checks import backend_of, generate

TIMEOUT = httpx.Timeout(120.0)
BODY = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 11}}'
JPEG, PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def url(engine) -> Iterator[str]:
    with serve_routes(backend_of(engine)) as served:
        yield served


def post(url: str, body: str | bytes = BODY, **headers: str) -> httpx.Response:
    return httpx.post(url, content=body, headers=headers, timeout=TIMEOUT)


def why(response: httpx.Response) -> str:
    """An assertion message: the JSON error, not a screenful of image bytes."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.text[:500]
    return f"{response.status_code} {response.headers.get('content-type')}"


def image_of(response: httpx.Response) -> Image.Image:
    return Image.open(io.BytesIO(response.content))


class Blocker:
    """Holds the engine's lock from a direct generation, stopped at its first step until released."""

    def __init__(self, engine) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine,), daemon=True)

    def _run(self, engine) -> None:
        generate(engine, GenerateRequest(prompt="hold", steps=2, seed=1), progress=self._step)

    def _step(self, step: int, total: int) -> None:
        self.started.set()
        self.release.wait(60)

    def __enter__(self) -> Blocker:
        self._thread.start()
        assert self.started.wait(60), "the blocking generation never started"
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._thread.join(60)


def test_the_curl_line_returns_a_jpeg_with_the_lora_applied(url, fixtures):
    plain = post(url)
    with_lora = post(url, lora=fixtures["peft"])
    assert plain.status_code == 200, why(plain)
    assert with_lora.status_code == 200, why(with_lora)
    assert with_lora.headers["content-type"] == "image/jpeg"
    assert with_lora.content.startswith(JPEG)
    assert with_lora.headers["x-seed"] == "11"
    assert with_lora.headers["x-lora-cache"] == f"{fixtures['peft']}=miss"
    assert image_of(with_lora).size == (64, 64)
    assert image_of(plain).tobytes() != image_of(with_lora).tobytes()


def test_accept_png_returns_a_lossless_png_that_reproduces_with_the_seed(url, fixtures):
    first = post(url, lora=fixtures["kohya"], accept="image/png")
    again = post(url, lora=fixtures["kohya"], accept="image/jpeg;q=0.5, image/png")
    assert first.status_code == 200, why(first)
    assert first.headers["content-type"] == "image/png"
    assert first.content.startswith(PNG)
    assert again.headers["content-type"] == "image/png"
    assert image_of(first).tobytes() == image_of(again).tobytes()
    assert again.headers["x-lora-cache"] == f"{fixtures['kohya']}=hit"


def test_lora_scale_and_every_parameter_are_applied(url, fixtures):
    body = (
        '{"inputs": "a cat", "parameters": {"num_inference_steps": 3, "guidance_scale": 3.5, "negative_prompt": "dog",'
        ' "width": 128, "height": 64, "seed": 5, "lora_scale": 0.5}}'
    )
    half = post(url, body, lora=fixtures["peft"], accept="image/png")
    full = post(url, body.replace('"lora_scale": 0.5', '"lora_scale": 1.0'), lora=fixtures["peft"], accept="image/png")
    assert half.status_code == 200, why(half)
    assert image_of(half).size == (128, 64)
    assert half.headers["x-seed"] == "5"
    assert image_of(half).tobytes() != image_of(full).tobytes()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('{"inputs": "a fox"', "not valid JSON"),
        ('["a fox"]', "JSON list"),
        ('{"parameters": {}}', "inputs must be the prompt as a string or a base64 image, got null"),
        ('{"inputs": 3}', "got number"),
        ('{"inputs": "a", "parameters": []}', "parameters must be a JSON object"),
        ('{"inputs": "a", "extra": 1}', "unknown field.* extra; accepted: inputs, parameters, options"),
        ('{"inputs": "a", "parameters": {"steps": 4}}', "unknown parameter.* steps; accepted: num_inference_steps"),
        ('{"inputs": "a", "parameters": {"num_inference_steps": "4"}}', "num_inference_steps must be an integer"),
        ('{"inputs": "a", "parameters": {"seed": true}}', "seed must be an integer, got boolean"),
        ('{"inputs": "a", "parameters": {"guidance_scale": [1]}}', "guidance_scale must be a number"),
        ('{"inputs": "a", "parameters": {"lora_scale": 0.5}}', "lora_scale was given without a LoRA"),
        ('{"inputs": "", "parameters": {}}', "prompt is empty"),
        ('{"inputs": "a", "parameters": {"num_inference_steps": 9999}}', "out of range"),
        ('{"inputs": "a", "parameters": {"width": 100}}', "not a multiple of 8"),
    ],
)
def test_bad_input_is_a_400_naming_the_problem(url, body, match):
    response = post(url, body)
    assert response.status_code == 400, why(response)
    assert response.json()["error_type"] in ("InvalidRequestError", "LimitExceededError")
    assert re.search(match, response.json()["error"])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        # Two sigma schedules: diffusers refuses them together; the run used to fail with a 500.
        (
            '{"use_exponential_sigmas": true, "use_karras_sigmas": true}',
            r"EulerDiscreteScheduler cannot run with use_exponential_sigmas=true, use_karras_sigmas=true: Only one "
            r"of .*; accepted for it: .*, one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas at a time",
        ),
        ('{"use_beta_sigmas": true}', None),  # the README offers it: scipy is a requirement (a 500 without it)
    ],
)
def test_scheduler_options_are_a_400_or_run_never_a_500(url, options, match):
    body = (
        '{"inputs": "a fox", "parameters": {"num_inference_steps": 2, "seed": 1, "scheduler": "Euler", '
        f'"scheduler_options": {options}}}}}'
    )
    response = post(url, body)
    if match is None:
        assert response.status_code == 200, why(response)
        return
    assert response.status_code == 400, why(response)
    assert response.json()["error_type"] == "InvalidRequestError"
    assert re.search(match, response.json()["error"]), response.json()["error"]


def test_a_deeply_nested_body_is_a_400_not_a_crash(url):
    response = post(url, "[" * 60_000)
    assert response.status_code == 400, why(response)
    assert "nested too deeply" in response.json()["error"]


def test_parse_body_reads_the_inference_api_shape():
    parsed = parse_body(
        b'{"inputs": "x", "parameters": {"num_inference_steps": 20.0, "guidance_scale": 7, "lora_scale": 0.8}}',
        lora=" owner/name ",
        accept="image/webp, image/png;q=0.9, image/jpeg;q=0.8",
    )
    assert parsed.request == GenerateRequest(prompt="x", loras=(LoraSpec("owner/name", 0.8),), steps=20, guidance=7)
    assert parsed.media_type == "image/png"
    assert parse_body(b'{"inputs": "x"}', lora=None, accept="*/*").media_type == "image/jpeg"
    with pytest.raises(InvalidRequestError, match=r"num_inference_steps must be an integer, got number 2\.5"):
        parse_body(b'{"inputs": "x", "parameters": {"num_inference_steps": 2.5}}', lora=None, accept=None)


def test_an_oversized_body_is_refused_before_parsing(url):
    response = post(url, '{"inputs": "' + "a" * (32 * 2**20) + '"}')
    assert response.status_code == 413
    assert "accepted: at most 33554432 bytes (MAX_BODY_BYTES" in response.json()["error"]


@pytest.mark.parametrize(
    ("role", "status", "error_type", "match"),
    [
        ("sd15", 400, "IncompatibleLoraError", "stable-diffusion-v1-5"),
        ("flux", 400, "IncompatibleLoraError", "accepted: LoRAs for the sdxl family"),
        ("oft", 400, "UnsupportedLoraVariantError", "OFT"),
        ("gated", 403, "GatedLoraError", "gated"),
        ("pickle-only", 400, "PickleOnlyError", ""),
    ],
)
def test_lora_problems_map_to_their_status(url, fixtures, role, status, error_type, match):
    response = post(url, lora=fixtures[role])
    assert response.status_code == status, why(response)
    assert response.json()["error_type"] == error_type
    assert match in response.json()["error"]
    assert fixtures[role] in response.json()["error"]


def test_an_unknown_lora_is_a_404(url):
    for lora in ("fixtures/no-such-lora", "local:nowhere.safetensors"):
        response = post(url, lora=lora)
        assert response.status_code == 404, why(response)
        assert response.json()["error_type"] == "LoraNotFoundError"
        assert lora in response.json()["error"]


def test_a_malformed_lora_header_is_a_400(url):
    response = post(url, lora="https://example.com/x.safetensors")
    assert response.status_code == 400
    assert "it is a URL" in response.json()["error"]


def test_an_unreachable_hub_is_a_503(loaded, base_settings):
    from engine.pools.engine import Engine
    from engine.prepare.resolve import AdapterResolver
    from lora_catalog.hub import HubSource

    dead = HubSource(endpoint=f"http://127.0.0.1:{free_port()}", timeout_s=2)
    engine = Engine(loaded, base_settings, AdapterResolver(dead, local_dir=None, token=None, max_bytes=2**30))
    try:
        with serve_routes(backend_of(engine)) as url:
            response = post(url, lora="someone/some-lora")
    finally:
        engine.close()
    assert response.status_code == 503, why(response)
    assert response.json()["error_type"] == "HubUnavailableError"


def test_a_full_queue_is_a_503_and_the_waiting_request_still_succeeds(make_engine):
    engine = make_engine(max_queue=1)
    with serve_routes(backend_of(engine)) as url, Blocker(engine) as blocker:
        responses: queue.Queue[httpx.Response] = queue.Queue()
        senders = [threading.Thread(target=lambda: responses.put(post(url))) for _ in range(2)]
        for sender in senders:
            sender.start()
        refused = responses.get(timeout=120)
        blocker.release.set()
        for sender in senders:
            sender.join(120)
        served = responses.get(timeout=1)
    assert refused.status_code == 503, why(refused)
    assert refused.json()["error_type"] == "EngineBusyError"
    assert "limit 1" in refused.json()["error"]
    assert served.status_code == 200


def test_x_queue_position_is_0_straight_to_the_gpu_and_1_behind_the_running_request(url, engine, monkeypatch):
    """README: "1 = next, 0 = straight to the GPU" (a request to an idle pool was answered 1 while it prepared)."""
    prepare = engine.scheduler._prepare

    def slow(request):
        # Still preparing when it joins, as a LoRA being downloaded is (a quick preparation could finish first).
        threading.Event().wait(0.5)
        return prepare(request)

    monkeypatch.setattr(engine.scheduler, "_prepare", slow)
    idle = post(url)
    assert idle.status_code == 200, why(idle)
    assert idle.headers["X-Queue-Position"] == "0"
    with Blocker(engine):
        responses: queue.Queue[httpx.Response] = queue.Queue()
        sender = threading.Thread(target=lambda: responses.put(post(url)))
        sender.start()
        view = engine.scheduler
        while view.waiting == 0 and sender.is_alive():
            threading.Event().wait(0.01)
    sender.join(120)
    behind = responses.get(timeout=1)
    assert behind.status_code == 200, why(behind)
    assert behind.headers["X-Queue-Position"] == "1"


def test_a_generation_failure_is_a_500_and_the_next_request_works(url, engine, fixtures, monkeypatch):
    def broken_decode(*args, **kwargs):
        raise RuntimeError("injected VAE failure")

    with monkeypatch.context() as patch:
        patch.setattr(engine.loaded.pipe.vae, "decode", broken_decode)
        failed = post(url, lora=fixtures["peft"])
    assert failed.status_code == 500, why(failed)
    assert failed.json()["error_type"] == "GenerationError"
    # The fixed text and an id (test_failure_ids.py), never the library's message.
    assert re.fullmatch(r"the request failed \(request id [0-9a-f]{12}\)", failed.json()["error"])
    assert post(url, lora=fixtures["peft"]).status_code == 200


def test_a_client_that_hangs_up_cancels_its_queued_request(engine):
    recording = recording_backend(engine)
    with serve_routes(recording) as url, Blocker(engine):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, content=BODY, timeout=httpx.Timeout(60.0, read=1.0))
        outcome = recording.outcomes.get(timeout=60)
    assert isinstance(outcome, GenerationCancelledError)


def test_the_url_form_names_the_served_base_and_refuses_others_with_a_404(url):
    plain = post(url)
    named = post(f"{url}models/stabilityai/stable-diffusion-xl-base-1.0")
    assert named.status_code == 200, why(named)
    assert named.content == plain.content
    refused = post(f"{url}models/black-forest-labs/FLUX.1-dev")
    assert refused.status_code == 404, why(refused)
    assert refused.json()["error_type"] == "UnservedBaseError"
    assert re.search(
        r"'black-forest-labs/FLUX.1-dev' is not served here; served: stabilityai/", refused.json()["error"]
    )
