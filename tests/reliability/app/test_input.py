"""The launched app under bad input, through `gradio_client`, `POST /` and the UI's handlers.

The package's one server (conftest.py: UI, named API and the inference-API POST on one port, over one engine
with an HF token, as a Space runs it). Every refusal is checked for its message (an `AppError` from
gradio_client, a JSON error with its HTTP status, a `gr.Error` from a UI handler) and for leaving the served
set as it was.
"""

from __future__ import annotations

import asyncio
import re
import socket

import gradio as gr
import httpx
import pytest
from gradio_client.exceptions import AppError

from tests.support.checks import BAD_REPOS, generate
from tests.support.reliability_app import (
    HTTP_STATUS,
    UI_ARGUMENTS,
    api,
    assert_http_error,
    body,
    plain,
    png_bytes,
    post,
    run_ui_generate,
    ui_handler,
)

# -- bad LoRAs ---------------------------------------------------------------------------------------------


APP_ROLES = (
    "truncated",
    "huge-header",
    "nan",
    "wrong-shapes",
    "high-rank",
    "pickle-only",
    "several",
    "gated",
    "private",
    "sd15-meta",
    "flux",
    "oft",
    "ia3",
)


@pytest.mark.parametrize("role", APP_ROLES)
def test_a_bad_lora_is_refused_by_both_apis_and_the_served_lora_stays(app, serving, fixtures, role):
    if role == "private":
        # The app's token sees the private repo: it is refused for being private, not as missing.
        error_type, fragment = (
            "LoraNotFoundError",
            r"'fixtures/private' is private; this Space serves public LoRAs only",
        )
    else:
        error_type, fragment = BAD_REPOS[role][0].__name__, BAD_REPOS[role][1]
    with pytest.raises(AppError, match=fragment):
        api(app, lora=fixtures[role], lora_2=fixtures["second"], lora_2_scale=0.7)
    response = post(app, body(), lora=fixtures[role])
    assert_http_error(response, HTTP_STATUS[error_type], error_type, fragment)


def test_a_missing_repo_revision_or_file_is_a_404_and_an_app_error(app, serving, fixtures):
    with pytest.raises(AppError, match=r"'fixtures/nowhere' was not found on the Hub"):
        api(app, lora="fixtures/nowhere")
    assert_http_error(post(app, body(), lora="fixtures/nowhere"), 404, "LoraNotFoundError", "was not found on the Hub")
    with pytest.raises(AppError, match=r"revision 'nope' of LoRA repo 'fixtures/peft' was not found"):
        app.client.predict(fixtures["peft"], "nope", "", api_name="/lora_info")
    with pytest.raises(AppError, match=r"file 'x\.safetensors' was not found in LoRA repo"):
        app.client.predict(fixtures["peft"], "", "x.safetensors", api_name="/lora_info")


# -- bad requests --------------------------------------------------------------------------------------------

API_REFUSALS: list[tuple[dict[str, object], str]] = [
    ({"prompt": ""}, r"prompt is empty; accepted: 1 to 2000 characters"),
    ({"prompt": "x" * 2001}, r"prompt has 2001 characters; accepted: at most 2000"),
    ({"prompt": "a\x1b[2Jb"}, r"prompt holds a control character U\+001B"),
    ({"negative_prompt": "\x00"}, r"negative_prompt holds a control character U\+0000"),
    ({"steps": 0}, r"steps=0 is out of range; accepted: an integer from 1 to 60"),
    ({"steps": 10_000}, r"steps=10000 is out of range"),
    ({"width": 65}, r"width=65 is not a multiple of 8"),
    ({"height": 10**6}, r"height=1000000 is out of range"),
    ({"guidance": 31.0}, r"guidance=31 is out of range; accepted: a number from 0 to 30"),
    ({"seed": 2**32}, r"seed=4294967296 is out of range"),
    ({"lora": "fixtures/peft", "lora_scale": 2.5}, r"scale of fixtures/peft=2\.5 is out of range"),
    ({"lora": "fixtures/peft", "lora_2": " fixtures/peft "}, r"LoRA 'fixtures/peft' is listed twice"),
    ({"lora": "../../etc/passwd"}, r"LoRA repo id '\.\./\.\./etc/passwd' is not accepted \(it contains '\.\.'\)"),
    ({"lora": "/etc/passwd"}, r"is not accepted \(it is a file path\)"),
    ({"lora": "C:\\loras\\x"}, r"is not accepted \(it is a file path\)"),
    ({"lora": "https://evil.example/x.safetensors"}, r"is not accepted \(it is a URL\)"),
    ({"lora": "local:../secret.safetensors"}, r"local ref 'local:\.\./secret\.safetensors' is not accepted"),
    ({"lora": "local:/etc/passwd"}, r"local ref 'local:/etc/passwd' is not accepted"),
]


@pytest.mark.parametrize(("overrides", "fragment"), API_REFUSALS)
def test_a_bad_request_through_gradio_client_is_an_app_error_naming_it(app, serving, hub, overrides, fragment):
    hub.clear_requests()
    with pytest.raises(AppError, match=fragment):
        api(app, **overrides)
    assert hub.requests == [], "a refused request reached the Hub"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"steps": 2.5}, r"steps=2\.5 is not an integer"),
        ({"steps": True}, r"steps=True is not an integer"),
        ({"seed": 1.5}, r"seed=1\.5 is not an integer"),
        ({"lora": "fixtures/peft", "lora_scale": None}, r"lora_scale"),
    ],
    ids=["float steps", "bool steps", "float seed", "no scale"],
)
def test_a_wrong_type_through_gradio_client_is_refused_by_name(app, overrides, fragment):
    with pytest.raises(AppError, match=fragment):
        api(app, **overrides)


HTTP_REFUSALS: list[tuple[bytes, str]] = [
    (b"\xff\xfe\x00{", "the body is not valid JSON"),
    (b"", "the body is not valid JSON"),
    (b"null", "the body is a JSON NoneType"),
    (b'"a fox"', "the body is a JSON str"),
    (b'{"inputs": "a", "parameters": {"guidance_scale": NaN}}', "guidance=nan is not a number"),
    (b'{"inputs": "a", "parameters": {"guidance_scale": -Infinity}}', "guidance=-inf is not a number"),
    (b'{"inputs": "a", "parameters": {"seed": 1e400}}', "parameter seed must be an integer"),
    (b'{"inputs": "a\\ud800"}', "prompt is not valid UTF-8 text (bad character at position 1)"),
    (b'{"inputs": "a\\u0000b"}', "prompt holds a control character U+0000 at position 1"),
    (b'{"inputs": "a", "parameters": {"num_inference_steps": 2.5}}', "num_inference_steps must be an integer"),
    (b'{"inputs": "a", "parameters": {"width": false}}', "parameter width must be an integer, got boolean"),
    (b'{"inputs": "a", "parameters": {"lora_scale": "1"}}', "parameter lora_scale must be a number"),
    (b'{"inputs": "a", "parameters": {"seed": -1}}', "seed=-1 is out of range"),
    (b'{"inputs": "a", "inputs": 5}', "inputs must be the prompt as a string or a base64 image, got number"),
]


@pytest.mark.parametrize(("raw", "fragment"), HTTP_REFUSALS)
def test_a_malformed_body_is_a_400_with_a_json_error(app, raw, fragment):
    assert_http_error(post(app, raw), 400, ("InvalidRequestError", "LimitExceededError"), re.escape(fragment))


def test_a_deeply_nested_body_is_a_400_not_a_server_error(app):
    assert_http_error(post(app, b"[" * 60_000), 400, "InvalidRequestError", "nested too deeply")


@pytest.mark.parametrize(
    ("lora", "fragment"),
    [
        ("caf\xe9/lora", "'café/lora' is not accepted (it is not owner/name)"),
        ("../x", "it contains '..'"),
        ("local:../../etc/passwd", "local ref 'local:../../etc/passwd' is not accepted"),
        ("C:\\x", "it is a file path"),
        ("file:///etc/passwd", "it is a URL"),
        ("owner/name/../../x", "is not accepted"),
        ("a" * 4000, "it is 4000 characters long"),
        ("fixtures/peft, fixtures/second", "is not accepted"),
    ],
)
def test_a_path_like_or_malformed_lora_header_is_a_400(app, hub, lora, fragment):
    hub.clear_requests()
    response = post(app, body(), lora=lora.encode("latin-1"))
    assert_http_error(response, 400, "InvalidRequestError", re.escape(fragment))
    assert hub.requests == []


def test_a_malformed_content_length_is_refused_and_the_server_goes_on(app, fixtures):
    host, port = httpx.URL(app.url).host, httpx.URL(app.url).port
    for length in (b"abc", b"-5", b"99999999999999999999"):
        with socket.create_connection((host, port), timeout=30) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
            answer = sock.recv(4096)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 413), answer[:200]
    assert png_bytes(post(app, body(seed=3))) == generate(app.backend, plain(seed=3)).image.tobytes()


# -- UI handlers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"ref": "fixtures/oft"}, r"uses OFT"),
        ({"ref": "fixtures/gated"}, r"is gated"),
        ({"ref": "../x"}, r"it contains '\.\.'"),
        ({"prompt": "  "}, r"prompt is empty"),
        ({"size": "65x64"}, r"width=65 is not a multiple of 8"),
        ({"size": "64 by 64"}, r"size '64 by 64' is not accepted; accepted: WIDTHxHEIGHT"),
        ({"seed": 2.5, "randomize": False}, r"seed=2\.5 is not an integer"),
    ],
)
def test_the_ui_shows_the_reason_as_a_gradio_error(app, serving, changes, fragment):
    with pytest.raises(gr.Error, match=fragment):
        # The handler is an async generator (it waits on the scheduler, not on a thread).
        run_ui_generate(ui_handler(app, "generate_ui"), **(UI_ARGUMENTS | changes))


def test_the_ui_check_shows_why_a_lora_is_refused(app, fixtures):
    card_html, _, _, _ = asyncio.run(ui_handler(app, "check_first")(fixtures["sd15"], "", "", "a prompt", {}, {}))
    assert "made for stable-diffusion-v1-5/stable-diffusion-v1-5" in card_html
