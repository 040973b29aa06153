"""A LoRA's strength by step through the doors (issue 51): `parameters.loras[i].schedule` and `start`/`end` on
`POST /`, the cluster wire, gradio_client's `lora_start`/`lora_end`; the same checked request whichever door or
form carried it, the same image bytes over HTTP for the long and the short form (and gradio_client's window), and a
bad schedule a 400 naming what is accepted."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from gradio_client.exceptions import AppError
from huggingface_hub import InferenceClient
from PIL import Image

from engine.errors import InvalidRequestError
from engine.normalise import normalise_loras
from engine.requests import LoraSpec
from engine.schedules import schedule_fields
from serving.cluster.wire import request_from_json, request_to_json
from serving.http.api import parse_body
from serving.recipes import parse_recipe
from tests.support.app_server import AppServer
from tests.support.reliability_app import CLIENT_GENERATE

TIMEOUT = httpx.Timeout(300.0)
SIZE = {"num_inference_steps": 4, "guidance_scale": 5.0, "width": 64, "height": 64, "seed": 9}


def body(*loras: dict) -> bytes:
    return json.dumps({"inputs": "a fox", "parameters": {"loras": list(loras)}}).encode()


def test_http_and_the_wire_carry_a_schedule_and_its_short_form_as_sent():
    sent = (
        {"path": "o/sda", "scale": 1.0, "start": 0, "end": 0.25},
        {"path": "o/ramp", "schedule": [[0, 0.4], [0.5, 0.9]]},
        {"path": "o/pair", "scale": 1.0, "schedule_2": [[0, 0.5], [0.75, 1.0]]},
    )
    request = parse_body(body(*sent), lora=None, accept=None).request
    assert [(s.start, s.end, s.schedule, s.schedule_2) for s in request.loras] == [
        (0, 0.25, (), ()),
        (None, None, ((0, 0.4), (0.5, 0.9)), ()),
        (None, None, (), ((0, 0.5), (0.75, 1.0))),
    ]
    wired = request_from_json(json.loads(json.dumps(request_to_json(request))))
    assert wired.loras == request.loras
    # Checked, the short form and its long form are one request.
    short = normalise_loras(parse_body(body(sent[0]), lora=None, accept=None).request.loras, 4)
    long = normalise_loras((LoraSpec("o/sda", schedule=((0, 1.0), (0.25, 0.0))),), 4)
    assert short == long == (LoraSpec("o/sda", 1.0, schedule=((0.0, 1.0), (0.25, 0.0))),)


@pytest.mark.parametrize(
    ("lora", "said"),
    [
        ({"schedule": [[0, 1], ["half", 0]]}, r"parameters\.loras\[0\]\.schedule"),
        ({"schedule": [[0, 1, 2]]}, r"parameters\.loras\[0\]\.schedule"),
        ({"start": "0"}, r"parameters\.loras\[0\]\.start"),
    ],
)
def test_a_malformed_schedule_is_refused_where_it_is(lora, said):
    with pytest.raises(InvalidRequestError, match=said):
        parse_body(body({"path": "o/l", **lora}), lora=None, accept=None)


def post(server: AppServer, loras: list[dict]) -> httpx.Response:
    document = {"inputs": "a fox in a forest", "parameters": {**SIZE, "loras": loras}}
    return httpx.post(server.url, content=json.dumps(document), headers={"accept": "image/png"}, timeout=TIMEOUT)


def test_post_runs_a_schedule_and_its_short_form_to_the_same_bytes(server, fixtures):
    peft = fixtures["peft"]
    long = post(server, [{"path": peft, "schedule": [[0, 0.0], [0.5, 2.0]]}])
    short = post(server, [{"path": peft, "scale": 2.0, "start": 0.5}])
    plain = post(server, [{"path": peft, "scale": 0.0}])
    for response in (long, short, plain):
        assert response.status_code == 200, response.text[:500]
    assert long.content == short.content
    image = Image.open(io.BytesIO(long.content))
    assert image.tobytes() != Image.open(io.BytesIO(plain.content)).tobytes()
    refused = post(server, [{"path": peft, "schedule": [[0, 1.0], [0.5, 0.0], [0.25, 1.0]]}])
    assert refused.status_code == 400
    assert "not increasing; accepted: a list of [from, scale] pairs" in refused.json()["error"]


def test_gradio_client_runs_a_window_to_the_pixels_post_answers(server, client, fixtures):
    """`/generate`'s `lora_start`/`lora_end` are `start`/`end` of `parameters.loras[]`: the same pixels."""
    peft = fixtures["peft"]
    sent = {"lora": peft, "lora_scale": 2.0, "lora_start": 0.25, "lora_end": 0.75, "steps": 4, "seed": 9}
    path, _ = client.predict(**(CLIENT_GENERATE | sent), api_name="/generate")
    answer = post(server, [{"path": peft, "scale": 2.0, "start": 0.25, "end": 0.75}])
    assert answer.status_code == 200, answer.text[:500]
    plain = post(server, [{"path": peft, "scale": 2.0}])
    with Image.open(path) as image, Image.open(io.BytesIO(answer.content)) as posted:
        assert image.convert("RGB").tobytes() == posted.convert("RGB").tobytes()
        # The window is in force: outside it the LoRA is off, so the image is not the LoRA's on every step.
        assert posted.tobytes() != Image.open(io.BytesIO(plain.content)).tobytes()


def test_inference_client_runs_a_schedule_whose_info_says_it_as_gradio_client_s_does(server, client, fixtures):
    """huggingface_hub's InferenceClient sends `loras[i].schedule` in `extra_body` (its `parameters`): the image
    (its pixels) is `/generate`'s with the same steps as a window, and the info each door gives says the schedule:
    the PNG's recipe (all an image over HTTP carries) reads back to the LoRA whose `schedule_fields` are the
    `loras[0].schedule` of `/generate`'s info."""
    peft = fixtures["peft"]
    inference = InferenceClient(model=server.url, headers={"accept": "image/png"}, timeout=300)
    sent = {"path": peft, "schedule": [[0, 0.0], [0.5, 2.0]]}
    image = inference.text_to_image("a fox in a forest", **SIZE, extra_body={"loras": [sent]})
    window = {"lora": peft, "lora_scale": 2.0, "lora_start": 0.5, "steps": 4, "seed": 9}
    path, info = client.predict(**(CLIENT_GENERATE | window), api_name="/generate")
    (said,) = info["loras"]
    assert said["schedule"] == sent["schedule"] and said["scale"] == 0.0
    with Image.open(path) as shown:
        assert image.convert("RGB").tobytes() == shown.convert("RGB").tobytes()
    (read,) = normalise_loras(parse_recipe(image.info["parameters"]).request.loras, 4)
    assert schedule_fields(read) == {"schedule": said["schedule"]}
    # The schedule is in force: the same LoRA at its last scale on every step is another image.
    plain = inference.text_to_image("a fox in a forest", **SIZE, extra_body={"loras": [{"path": peft, "scale": 2.0}]})
    assert plain.tobytes() != image.tobytes()


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        ({"lora_start": 0.25}, "lora_start=0.25 was given, but lora is empty"),
        ({"lora_2_end": 0.5}, "lora_2_end=0.5 was given, but lora_2 is empty"),
    ],
)
@pytest.mark.parametrize("api_name", ["/generate", "/generate_images"])
def test_gradio_client_refuses_a_window_for_an_empty_lora_slot(client, fixtures, sent, said, api_name):
    """A window on a slot with no LoRA is a schedule on a LoRA the request does not use: refused by name, not
    dropped (the request would run without the schedule the caller asked for)."""
    named = {"lora": fixtures["peft"]} if "lora_2_end" in sent else {}
    with pytest.raises(AppError, match=f"{said}: a schedule on a LoRA the request does not use; accepted: "):
        client.predict(**(CLIENT_GENERATE | named | sent), api_name=api_name)


def test_gradio_client_runs_an_empty_slot_s_whole_run_window(client, fixtures):
    """0 to 1, every step's window, is what no window runs: an empty slot may carry it (as the UI's range does)."""
    sent = {"lora": fixtures["peft"], "lora_2_start": 0.0, "lora_2_end": 1.0}
    path, info = client.predict(**(CLIENT_GENERATE | sent), api_name="/generate")
    assert [lora["scale"] for lora in info["loras"]] == [1.0]
    plain, _ = client.predict(**(CLIENT_GENERATE | {"lora": fixtures["peft"]}), api_name="/generate")
    with Image.open(path) as image, Image.open(plain) as expected:
        assert image.tobytes() == expected.tobytes()
