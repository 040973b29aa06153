"""The request is declared once (`GenerateRequest`'s fields, `engine.request_schema`): the HTTP body, the
cluster's wire and the Gradio API are held equal to that declaration, so a field added there and not at an edge
fails here."""

from __future__ import annotations

from dataclasses import fields

from engine.requests import REQUEST_FIELDS, GenerateRequest
from serving.cluster import wire
from serving.http import body

# Parameters of POST / that fill no request field of their own: the `lora` header's scale.
HTTP_ONLY = {"lora_scale"}


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
        accepts = next(f.accepts for f in REQUEST_FIELDS if f.name == name)
        assert model[http].description == accepts or name == "loras"
    # Hugging Face's names, as its inference API spells them.
    assert declared["num_inference_steps"] == "steps"
    assert declared["guidance_scale"] == "guidance"


def test_the_wire_carries_every_declared_field_and_the_checked_request_more():
    assert list(wire._RequestJson.model_fields) == [f.name for f in REQUEST_FIELDS]
    assert [n for n, f in wire._RequestJson.model_fields.items() if f.is_required()] == ["prompt"]
    assert set(wire._CheckedJson.model_fields) - set(wire._RequestJson.model_fields) == {"sampler", "defaults_from"}
