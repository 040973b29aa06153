"""The request is declared once (`GenerateRequest`'s fields, `engine.request_schema`): the HTTP body, the
cluster's wire and the Gradio API are held equal to that declaration, so a field added there and not at an edge
fails here."""

from __future__ import annotations

import inspect
from dataclasses import fields
from types import SimpleNamespace

import gradio as gr

from engine.requests import DECLARED_FIELDS, REQUEST_FIELDS, GenerateRequest, ModelDefaults
from serving.cluster import wire
from serving.http import body
from serving.ui.gradio_api import add_api_endpoints

# Parameters of POST / that fill no request field of their own: the `lora` header's scale; image-to-image's prompt
# and target size (Hugging Face's task puts the image in `inputs`: serving.http.images).
HTTP_ONLY = {"lora_scale", "prompt", "target_size"}


def test_every_request_field_is_declared_once_with_what_it_accepts():
    assert [f.name for f in REQUEST_FIELDS] == [f.name for f in fields(GenerateRequest)]
    for declared in REQUEST_FIELDS:
        assert declared.accepts and declared.description, declared.name
        if declared.low is not None and declared.high is not None:
            assert declared.low < declared.high


def test_the_http_parameters_are_the_declared_fields_under_their_inference_api_names():
    model = body._Parameters.model_fields
    declared = {f.http: f.name for f in REQUEST_FIELDS if f.http is not None}
    assert set(model) - HTTP_ONLY == set(declared)
    for http, name in declared.items():
        assert (model[http].serialization_alias or http) == name
        assert model[http].description == DECLARED_FIELDS[name].accepts or name == "loras"
    # Hugging Face's names, as its inference API spells them.
    assert declared["num_inference_steps"] == "steps"
    # Not parameters: the prompt (or, image-to-image, the image) is the body's `inputs`; POST / answers one
    # image, with the LoRAs' defaults, or what the pool makes (`expects`, which a door sets itself).
    not_parameters = {"prompt", "num_images", "lora_defaults", "image", "expects"}
    assert {f.name for f in REQUEST_FIELDS if f.http is None} == not_parameters
    assert declared["guidance_scale"] == "guidance"


def test_the_wire_carries_every_declared_field_and_the_checked_request_more():
    assert list(wire._RequestJson.model_fields) == [f.name for f in REQUEST_FIELDS]
    assert [n for n, f in wire._RequestJson.model_fields.items() if f.is_required()] == ["prompt"]
    added = set(wire._CheckedJson.model_fields) - set(wire._RequestJson.model_fields)
    assert added == {"sampler", "defaults_from", "left_unset", "notes"}


def _api_parameters() -> dict[str, list[str]]:
    """Each named generation endpoint's parameters, as Gradio reads them from its function's signature."""
    defaults = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)
    with gr.Blocks() as demo:
        add_api_endpoints(SimpleNamespace(default=SimpleNamespace(defaults=defaults)))  # type: ignore[arg-type]
    return {
        fn.api_name: list(inspect.signature(fn.fn).parameters)
        for fn in demo.fns.values()
        if fn.api_name in ("generate", "generate_images") and fn.fn is not None
    }


def test_the_gradio_api_takes_every_declared_field_by_its_declared_names():
    """A field added to the request and not to the Gradio API's signatures (or one offered under another name)
    fails here; `base` (which pool) and `progress` (Gradio's) are the API's own. The video fields
    (`RequestField.video`) are the video endpoint's: the image endpoints' signatures stay as they were."""
    declared = [name for f in REQUEST_FIELDS if not f.video for name in f.gradio]
    # The fields the API does not take: the UI's switch (the API runs with the LoRAs' recommendations), the
    # kind each endpoint answers, which it sets itself, and an IC-LoRA's reference video and its in-context
    # settings (the video endpoint's last arguments: `gradio_video_last`).
    ic = ["reference_video", "reference_strength", "reference_downscale"]
    assert [f.name for f in REQUEST_FIELDS if not f.gradio] == ["lora_defaults", "expects", *ic]
    assert [f.name for f in REQUEST_FIELDS if f.video] == ["num_frames", "fps", "guidance_2", *ic]
    # Then the arguments every generation endpoint takes last (each LoRA's schedule window).
    declared += [name for f in REQUEST_FIELDS for name in f.gradio_late]
    assert declared[-4:] == ["lora_start", "lora_end", "lora_2_start", "lora_2_end"]
    own = ("base", "progress")
    found = _api_parameters()
    assert [p for p in found["generate_images"] if p not in own] == declared
    # /generate makes one image: everything else, in the same order.
    assert [p for p in found["generate"] if p not in own] == [p for p in declared if p != "num_images"]
