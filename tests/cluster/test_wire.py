"""The front end's side of the cluster, without Ray: BACKEND_URL, the wire format and RemoteBackend's errors.

The cluster itself (and RemoteBackend against it) is tested in tests/cluster/test_ray.py (marked `ray`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, fields

import httpx
import numpy as np
import pytest
from PIL import Image

from engine.errors import (
    BackendUnavailableError,
    EngineBusyError,
    GatedLoraError,
    GenerationCancelledError,
    InvalidRequestError,
    LimitExceededError,
    SettingsError,
    UnsupportedLoraVariantError,
)
from engine.images import EncodedImage, InputImage, decode_image, encoded_image
from engine.outcomes import ServedPool
from engine.requests import (
    AdapterUse,
    CheckedRequest,
    GenerateRequest,
    GenerateResult,
    LoraSpec,
    ModelDefaults,
    Timings,
)
from engine.settings import Settings
from lora_catalog.errors import AmbiguousWeightsError
from serving.backends import blocking
from serving.backends.remote import RemoteBackend
from serving.cluster.wire import (
    adapter_set_id,
    decode_png,
    encode_png,
    error_from_body,
    pools_from_json,
    pools_to_json,
    request_from_json,
    request_to_json,
    result_from_json,
    result_to_json,
    spec_from_json,
)
from tests.support.checks import generate
from tests.support.image_inputs import example_image, example_mask, png_bytes


@pytest.mark.parametrize("url", ["http://head:8000", "https://cluster.example.com/", "http://10.0.0.2"])
def test_backend_url_accepts_http_urls(url):
    assert Settings.from_env({"BACKEND_URL": url}).backend_url == url.rstrip("/")
    assert Settings.from_env({}).backend_url is None


@pytest.mark.parametrize("url", ["head:8000", "ftp://head", "http://", "http://head:99999", "http://h/?x=1", "ray://h"])
def test_backend_url_refuses_anything_else_by_name(url):
    with pytest.raises(SettingsError, match=r"BACKEND_URL=.*accepted: .*"):
        Settings.from_env({"BACKEND_URL": url})


def test_the_adapter_set_id_ignores_order_and_scale():
    a, b = LoraSpec("o/a", 0.5), LoraSpec("o/b", 1.0, revision="main")
    one = GenerateRequest(prompt="x", loras=(a, b))
    other = GenerateRequest(prompt="y", loras=(LoraSpec("o/b", -1.0, revision="main"), LoraSpec("o/a")))
    assert adapter_set_id(one) == adapter_set_id(other) != ""
    assert adapter_set_id(GenerateRequest(prompt="x", loras=(a,))) != adapter_set_id(one)
    assert adapter_set_id(GenerateRequest(prompt="x")) == ""


def test_requests_round_trip_and_bad_ones_are_refused():
    request = GenerateRequest(prompt="x", loras=(LoraSpec("o/a", 0.5, "main", "w.safetensors"),), steps=3, seed=2)
    assert request_from_json(json.loads(json.dumps(request_to_json(request)))) == request
    for bad in ({"prompt": "x", "colour": 1}, {"steps": 2}, {"prompt": "x", "loras": [{"name": "o/a"}]}, []):
        with pytest.raises(ValueError, match="accepted"):
            request_from_json(bad)


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"prompt": "x", "loras": [{"ref": 5}]}, r"loras\[0\]\.ref: .*got 5"),
        ({"prompt": "x", "loras": [{"ref": "o/a", "revision": ["main"]}]}, r"loras\[0\]\.revision: .*got \['main'\]"),
        ({"prompt": "x", "loras": "o/a"}, r"at loras: .*got 'o/a'"),
        ({"prompt": "x", "loras": [{"ref": "o/a", "scale": "1"}]}, r"loras\[0\]\.scale: not a JSON number, got '1'"),
        ({"prompt": "x", "steps": True}, r"at steps: not a JSON number, got True"),
        ({"prompt": ["x"]}, r"at prompt: .*got \['x'\]"),
        ("a fox", r"at its top: not an object"),
    ],
)
def test_a_malformed_request_is_a_400_naming_where_never_a_500(document, where):
    with pytest.raises(InvalidRequestError, match=where) as raised:
        request_from_json(document)
    assert raised.value.status == 400
    assert "accepted: an object with fields" in str(raised.value)


def test_a_malformed_lora_spec_is_a_400_too():
    with pytest.raises(InvalidRequestError, match=r"the LoraSpec is refused at revision: .*got 3") as raised:
        spec_from_json({"ref": "o/a", "revision": 3})
    assert raised.value.status == 400


def test_the_wire_models_carry_every_field_of_the_engines_dataclasses():
    # Mirrors of GenerateRequest and LoraSpec: a field added there and not on the wire would be dropped.
    request = GenerateRequest(
        prompt="p",
        negative_prompt="n",
        loras=(LoraSpec("o/a", 2, "r", "w"),),
        steps=4,
        guidance=1.5,
        width=64,
        height=72,
        seed=9,
        scheduler="DPM++ 2M",
        scheduler_options=(("use_karras_sigmas", True), ("timestep_spacing", "trailing")),
        clip_skip=1,
        num_images=3,
        lora_defaults=False,
    )
    document = json.loads(json.dumps(request_to_json(request)))
    assert set(document) == {f.name for f in fields(GenerateRequest)}
    assert request_from_json(document) == request


def test_a_checked_request_and_every_image_come_back_from_the_cluster():
    checked = CheckedRequest(
        prompt="p",
        steps=4,
        guidance=1.0,
        width=64,
        height=64,
        seed=9,
        scheduler="LCMScheduler",
        num_images=2,
        sampler="LCM",
        defaults_from=(("steps", "speed LoRA o/lcm (LCM)"),),
    )
    images = [Image.new("RGB", (8, 8), (i, 0, 0)) for i in (1, 2)]
    result = GenerateResult(images[0], 9, checked, Timings(), more_images=(images[1],))
    document = json.loads(json.dumps(result_to_json(result)))
    assert set(document["request"]) == {f.name for f in fields(CheckedRequest)}
    back = result_from_json(document, decode_png(encode_png(images[0])), [decode_png(encode_png(images[1]))])
    assert back.request == checked
    assert [i.getpixel((0, 0)) for i in back.images] == [(1, 0, 0), (2, 0, 0)]
    assert back.seeds == (9, 10)


def test_an_answer_that_does_not_fit_is_backend_trouble():
    with pytest.raises(BackendUnavailableError, match=r"cannot read \(pools: .*at least 1 item"):
        pools_from_json({"pools": []})
    pool = {"base_model_id": "o/b", "model_id": "o/b", "family": "sdxl", "default": True}
    with pytest.raises(BackendUnavailableError, match=r"cannot read \(pools\[0\]\.defaults: Field required\)"):
        pools_from_json({"pools": [pool]})
    answer = _result(GenerateRequest(prompt="x"))
    with pytest.raises(
        BackendUnavailableError, match=r"a result this Space cannot read \(timings\.total: .*got 'soon'"
    ):
        result_from_json({**answer["result"], "timings": {"total": "soon"}}, b"")


@pytest.mark.parametrize(
    "cls",
    [GatedLoraError, UnsupportedLoraVariantError, EngineBusyError, AmbiguousWeightsError, GenerationCancelledError],
)
def test_a_json_error_becomes_the_same_class_with_the_same_message(cls):
    error = error_from_body({"error": "the message", "error_type": cls.__name__}, cls.status)
    assert type(error) is cls
    assert str(error) == "the message"
    assert (error.status, error.title) == (cls.status, cls.title)


def test_unknown_or_unreadable_errors_are_backend_trouble():
    assert isinstance(error_from_body({"error": "m", "error_type": "KeyError"}, 500), BackendUnavailableError)
    assert "HTTP 502" in str(error_from_body(None, 502))


def _result(request: GenerateRequest) -> dict:
    image = Image.new("RGB", (8, 8), (10, 20, 30))
    result = GenerateResult(
        image=image,
        seed=7,
        request=request,
        timings=Timings(1.0, 2.0, 3.0, 4.0, 10.0),
        adapters=(AdapterUse("o/a", "abc", "w.safetensors", 0.5, "miss"),),
        swapped=True,
        warnings=("careful",),
    )
    return {"image": encode_png(image), "result": result_to_json(result)}


POOLS = (
    ServedPool(
        "owner/base", "owner/model", "sdxl", ModelDefaults(steps=25, guidance=5.0, side=1024, max_side=1536), True
    ),
)


def test_remote_backend_rebuilds_the_result_and_maps_errors():
    seen: list[tuple[str, dict]] = []

    def backend(http: httpx.Request) -> httpx.Response:
        if http.url.path == "/v1/pools":
            return httpx.Response(200, json=pools_to_json(POOLS))
        document = json.loads(http.content)
        seen.append((http.url.path, document))
        if document["prompt"] == "gated":
            return httpx.Response(403, json={"error": "LoRA 'o/g' is gated", "error_type": "GatedLoraError"})
        if document["prompt"] == "garbled":
            return httpx.Response(200, content=b"not json")
        return httpx.Response(200, json=_result(request_from_json(document)))

    remote = RemoteBackend("http://cluster", timeout_s=5, transport=httpx.MockTransport(backend))
    assert remote.pools() == POOLS
    request = GenerateRequest(prompt="a fox", loras=(LoraSpec("o/a", 0.5),), seed=7)
    steps: list[tuple[int, int]] = []
    result = blocking(remote.generate(request, base="owner/base", progress=lambda d, t: steps.append((d, t))))
    assert seen[0][0] == "/v1/models/owner/base/generate"
    # The same request field for field (it comes back as the cluster's checked request type).
    assert {k: v for k, v in asdict(result.request).items() if k in asdict(request)} == asdict(request)
    assert result.image.getpixel((0, 0)) == (10, 20, 30)
    assert result.adapters[0].cache == "miss" and result.warnings == ("careful",) and result.timings.total == 10.0
    assert steps == [(1, 1)]
    with pytest.raises(GatedLoraError, match="is gated"):
        blocking(remote.generate(GenerateRequest(prompt="gated")))
    with pytest.raises(BackendUnavailableError, match="HTTP 200 without a JSON error"):
        blocking(remote.generate(GenerateRequest(prompt="garbled")))


def test_remote_backend_says_when_the_backend_cannot_be_reached():
    reachable = True

    def refuse(http: httpx.Request) -> httpx.Response:
        if reachable:
            return httpx.Response(200, json=pools_to_json(POOLS))
        raise httpx.ConnectError("connection refused", request=http)

    remote = RemoteBackend("http://cluster", timeout_s=5, transport=httpx.MockTransport(refuse))
    reachable = False
    with pytest.raises(BackendUnavailableError, match=r"http://cluster could not be reached \(ConnectError"):
        blocking(remote.generate(GenerateRequest(prompt="x")))
    with pytest.raises(SettingsError, match=r"BACKEND_URL='http://cluster' could not be reached"):
        RemoteBackend("http://cluster", timeout_s=5, transport=httpx.MockTransport(refuse))


def _cached(engine) -> set[str]:
    return {str(c.key) for c in engine.status().cached}


def test_a_held_set_stays_cached_and_let_go_evicts_it_once_unused(make_engine, fixtures):
    """What a replica's AdapterPin does when Serve loads and evicts an adapter set."""
    engine = make_engine()
    request = GenerateRequest(prompt="x", loras=(LoraSpec(fixtures["peft"]),), steps=1, seed=1)
    with engine.prepare(request) as prepared:
        keys = tuple(adapter.key for adapter, *_ in prepared.adapters)
        engine.hold(keys)
    assert {str(k) for k in keys} <= _cached(engine)
    with engine.prepare(request) as prepared:
        assert prepared.uses[0].cache == "hit"
        engine.let_go(keys)  # Serve evicts while a request still uses the set: it stays until that ends
        assert {str(k) for k in keys} <= _cached(engine)
        engine.run(prepared)
    # Fused now (the swap uses it): evicted once another set, or none, is served.
    generate(engine, GenerateRequest(prompt="x", steps=1, seed=1))
    assert not {str(k) for k in keys} & _cached(engine)
    again = generate(engine, request)
    assert again.adapters[0].cache == "miss"


def test_a_replica_pins_exactly_the_keys_its_request_prepared(make_engine, fixtures):
    """A replica holds an adapter set by the keys it reads back from the result (`AdapterPin`): the very keys the
    engine prepared, for Hub and local LoRAs alike (every kind of reference: tests/cluster/test_lease.py)."""
    from serving.cluster.replica import lease_keys

    engine = make_engine()
    request = GenerateRequest(
        prompt="x", loras=(LoraSpec(fixtures["peft"]), LoraSpec(fixtures.local["kohya"])), steps=1, seed=1
    )
    with engine.prepare(request) as prepared:
        keys = tuple(adapter.key for adapter, *_ in prepared.adapters)
    result = generate(engine, request)
    assert lease_keys(result) == keys


def _photo(side: int) -> Image.Image:
    """A photo-like image: smooth colour with some grain (a camera's noise), `side` square."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    smooth = np.stack([x * 255 / side, y * 255 / side, (x + y) * 127 / side], axis=-1)
    return Image.fromarray((smooth + rng.normal(0, 3, smooth.shape)).clip(0, 255).astype(np.uint8), "RGB")


def test_a_requests_pixels_cross_the_wire_as_png_files_read_back_as_files_with_the_same_pixels():
    request = GenerateRequest(
        prompt="x", image=InputImage.from_pil(_photo(96)), mask_image=InputImage.from_pil(example_mask(), "L")
    )
    document = json.loads(json.dumps(request_to_json(request)))
    assert set(document["image"]) == {"mode", "file"}
    assert base64.b64decode(document["image"]["file"]).startswith(b"\x89PNG\r\n\x1a\n")
    back = request_from_json(document)
    # Read back as files (their headers only: the engine's check decodes them), the same pixels once decoded.
    assert isinstance(back.image, EncodedImage) and isinstance(back.mask_image, EncodedImage)
    assert back.image.decoded(10**6) == request.image and back.mask_image.decoded(10**6) == request.mask_image
    assert request_from_json(request_to_json(back)) == back, "a file crosses as itself"


def test_a_clients_own_file_crosses_the_wire_as_itself_and_so_does_the_file_its_pixels_came_from():
    jpeg = png_bytes(_photo(96), "JPEG")
    sent = GenerateRequest(prompt="x", image=encoded_image(jpeg, what="inputs", max_pixels=10**6))
    document = json.loads(json.dumps(request_to_json(sent)))
    assert base64.b64decode(document["image"]["file"]) == jpeg
    assert request_from_json(document) == sent
    # A checked request's image decoded from that file (the result's request) crosses as the same file.
    checked = CheckedRequest(prompt="x", image=decode_image(jpeg, what="inputs", max_pixels=10**6))
    assert base64.b64decode(request_to_json(checked)["image"]["file"]) == jpeg


def test_a_2048_square_image_on_the_wire_is_smaller_than_its_raw_pixels_in_base64(capsys):
    image = InputImage.from_pil(_photo(2048))
    raw_base64 = len(base64.b64encode(image.data))  # how it crossed before: 16777216 characters
    sent = len(json.dumps(request_to_json(GenerateRequest(prompt="x", image=image))["image"]))
    with capsys.disabled():
        print(f"\nwire size of a 2048x2048 RGB image: {raw_base64} (raw base64) -> {sent} (PNG base64)")
    assert raw_base64 == 4 * 2048 * 2048 and sent < raw_base64


@pytest.mark.parametrize(
    ("image", "match"),
    [
        ({"mode": "RGB", "file": base64.b64encode(b"not a png").decode()}, r"image is not an image \(9 bytes"),
        ({"mode": "RGB", "file": "%%%"}, "image on the wire is not base64"),
        ({"mode": "RGB", "file": base64.b64encode(png_bytes(example_image(), "GIF")).decode()}, "image is a GIF"),
    ],
)
def test_a_bad_image_on_the_wire_is_a_400_naming_it_never_a_repr(image, match):
    with pytest.raises(InvalidRequestError, match=match) as refused:
        request_from_json({"prompt": "x", "image": image})
    assert refused.value.status == 400 and "object at 0x" not in str(refused.value)


def test_an_image_over_max_input_pixels_is_refused_on_the_wire_from_its_header():
    document = request_to_json(GenerateRequest(prompt="x", image=InputImage.from_pil(example_image(64, 64))))
    with pytest.raises(LimitExceededError, match=r"image is 64x64 \(4096 pixels\); accepted: at most 4095"):
        request_from_json(document, max_pixels=4095)
