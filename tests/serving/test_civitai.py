"""Civitai LoRAs through every door of the launched app (the `lora` header, `parameters.loras[].path`,
`gradio_client`'s `/generate` and `/lora_info`, which the UI's custom-LoRA box calls too), with CIVITAI_TOKEN set
from the settings: refusals as JSON with their status, the fine-tune header, and the token never shown."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
from gradio_client.exceptions import AppError
from PIL import Image

from engine.pools.engine import Engine
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.prepare.civitai import civitai_files
from engine.prepare.resolve import AdapterResolver
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from lora_catalog.catalog import Catalog
from lora_catalog.entries import LoraEntry
from lora_catalog.errors import InvalidRequestError
from lora_catalog.hub import HubSource
from serving.backends.local import LocalBackend
from serving.http.api import lora_from_path
from serving.ui import formatting as fmt
from tests.support.app_server import AppServer, serve_app
from tests.support.checks import LOGGERS
from tests.support.clients import api_client
from tests.support.loras import peft_file
from tests.support.reliability_app import CLIENT_GENERATE
from tests.support.standin_civitai import StandInCivitai

TOKEN = "civitai_key_9Hq2Lx7Vb4Nm0Rt6Yz1W"
TIMEOUT = httpx.Timeout(120.0)
SIZE = {"num_inference_steps": 2, "guidance_scale": 5.0, "width": 64, "height": 64, "seed": 9}


@pytest.fixture(scope="module")
def civitai(loaded) -> Iterator[StandInCivitai]:
    data = peft_file(loaded.pipe, seed=95)
    with StandInCivitai() as started:
        started.add_lora(2001, data, model_id=200, trained_words=("civglow",), clip_skip=2, settings={"strength": 0.7})
        started.add_lora(2002, data, base_model="Illustrious")
        started.add_lora(2003, data, base_model="Flux.1 D")
        started.add_lora(2004, data, model_type="Checkpoint")
        started.add_lora(2005, data, nsfw=True)
        started.add_lora(2006, data, download="tampered")
        started.add_lora(2007, data, download="elsewhere")
        started.add_lora(2008, data, download="login")
        started.add_lora(2009, data)
        yield started


@pytest.fixture(scope="module")
def server(loaded, loaded_sd15, base_settings, hub, civitai, tmp_path_factory) -> Iterator[AppServer]:
    settings = base_settings.replace(
        civitai_endpoint=civitai.url,
        civitai_token=TOKEN,
        civitai_allowed_hosts=(civitai.storage_host,),
        civitai_cache_dir=tmp_path_factory.mktemp("civitai-files"),
        local_lora_dir=None,
    )
    files = civitai_files(settings)
    assert files is not None
    catalog = Catalog(HubSource(endpoint=hub.url, timeout_s=5), civitai=files.source)
    resolver = AdapterResolver(catalog, local_dir=None, token=None, max_bytes=settings.max_adapter_bytes, civitai=files)
    engines = [
        Engine(loaded, settings, resolver),
        Engine(loaded_sd15, settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    pools = Pools(engines, resolver, Residency(torch.device("cpu"), None))
    try:
        with serve_app(engines[0], catalog, hub_url=hub.url, backend=LocalBackend(pools), metrics=True) as served:
            yield served
    finally:
        pools.close()
        catalog.close()


def post(server: AppServer, parameters: dict | None = None, **headers: str) -> httpx.Response:
    body = json.dumps({"inputs": "a fox in a forest", "parameters": {**SIZE, **(parameters or {})}})
    return httpx.post(server.url, content=body, headers={"accept": "image/png", **headers}, timeout=TIMEOUT)


def image(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text[:500]
    return np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB"))


def test_every_form_generates_through_the_header_and_the_list(server):
    forms = [
        "civitai:2001",
        "https://civitai.com/models/200?modelVersionId=2001",
        "https://civitai.com/models/200/a-slug",
        "https://civitai.com/api/download/models/2001",
        "urn:air:sdxl:lora:civitai:200@2001",
    ]
    reference = post(server, lora=forms[0])
    assert reference.headers["x-lora-cache"].startswith("civitai:2001=")
    assert "x-lora-trained-for" not in reference.headers
    for form in forms:
        by_header = post(server, lora=form)
        by_list = post(server, {"loras": [{"path": form, "scale": 1.0}]})
        assert np.array_equal(image(by_header), image(reference)), form
        assert np.array_equal(image(by_list), image(reference)), form
        # The ref is what was named (a model alone stays the model; the version it ran is the revision).
        named = "civitai:models/200" if form.endswith("a-slug") else "civitai:2001"
        assert by_list.headers["x-lora-cache"] == f"{named}=hit"


def test_a_body_path_parses_civitai_links_and_refuses_the_rest():
    assert lora_from_path("https://civitai.com/models/1?modelVersionId=2") == ("civitai:2", None, None)
    assert lora_from_path("urn:air:sdxl:lora:civitai:1@2") == ("urn:air:sdxl:lora:civitai:1@2", None, None)
    with pytest.raises(InvalidRequestError, match=r"parameters\.loras\[0\]\.path: .*carries a token") as caught:
        lora_from_path(f"https://civitai.com/models/1?modelVersionId=2&token={TOKEN}", where="parameters.loras[0].path")
    assert TOKEN not in str(caught.value)
    with pytest.raises(InvalidRequestError, match=r"parameters\.loras\[0\]\.path: .*not a model page or a download"):
        lora_from_path("https://civitai.com/images/5", where="parameters.loras[0].path")


@pytest.mark.parametrize(
    ("ref", "status", "error_type", "named"),
    [
        ("civitai:2004", 400, "NotALoraError", "is a checkpoint"),
        ("civitai:2005", 403, "ContentPolicyError", "marked NSFW"),
        ("civitai:2003", 404, "UnservedBaseError", "FLUX.1-dev"),
        ("civitai:2006", 502, "DownloadRefusedError", "SHA256"),
        ("civitai:2007", 502, "DownloadRefusedError", "files.example.invalid"),
        ("civitai:2008", 403, "RestrictedLoraError", "no access"),
        ("civitai:99999", 404, "LoraNotFoundError", "no published model version 99999"),
    ],
)
def test_refusals_are_json_errors_with_their_status(server, ref, status, error_type, named):
    response = post(server, lora=ref)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_type"] == error_type and named in body["error"]


def test_a_finetune_on_the_sdxl_pool_says_so_in_a_header_and_a_warning(server):
    response = post(server, lora="civitai:2002")
    assert response.status_code == 200
    assert response.headers["x-lora-trained-for"] == "civitai:2002=Illustrious"


def test_gradio_client_generates_and_describes_civitai_loras(server):
    client = api_client(server.url, verbose=False)
    _, info = client.predict(
        **(CLIENT_GENERATE | {"lora": "https://civitai.com/models/200?modelVersionId=2001"}), api_name="/generate"
    )
    assert info["loras"][0]["ref"] == "civitai:2001" and info["loras"][0]["revision"] == "2001"
    _, warned = client.predict(**(CLIENT_GENERATE | {"lora": "civitai:2002"}), api_name="/generate")
    assert warned["loras"][0]["trained_for"] == "Illustrious"
    assert any("trained for Illustrious" in w for w in warned["warnings"])
    # The custom-LoRA box's check: the entry (trigger words, page, recommendations) and whether it loads here.
    described = client.predict(
        repo_id="urn:air:sdxl:lora:civitai:200@2001", revision="", weight_name="", api_name="/lora_info"
    )
    entry = LoraEntry.from_json(described["entry"])
    assert (
        entry.trigger_words == ("civglow",)
        and entry.hints.clip_skip == 1
        and dict(entry.recommended)["strength"] == 0.7
    )
    assert entry.page_url is not None and entry.page_url.endswith("/models/200?modelVersionId=2001")
    assert described["check"]["revision"] == "2001"
    card = fmt.entry_card(entry, "https://huggingface.co", None)
    assert "civglow" in card and "Civitai · SDXL 1.0" in card and "CLIP skip 2" in card and entry.page_url in card
    with pytest.raises(AppError, match="is a checkpoint"):
        client.predict(repo_id="civitai:2004", revision="", weight_name="", api_name="/lora_info")
    # The catalogue's Civitai tab: what runs on the SDXL pool (the Illustrious one with it), the rest left out.
    page = client.predict(base="", search="", sort="downloads", page=0, source="civitai", api_name="/catalog")
    listed = {e["ref"] for e in page["entries"]}
    assert {"civitai:2001", "civitai:2002"} <= listed and not listed & {"civitai:2003", "civitai:2004", "civitai:2005"}
    assert page["freshness"]["source"] == "civitai"
    hub_page = client.predict(base="", search="", sort="downloads", page=0, api_name="/catalog")
    assert all(e["source"] != "civitai" for e in hub_page["entries"])


def test_the_token_reaches_the_api_host_only_and_is_never_shown(server, civitai, caplog):
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    civitai.clear_requests()
    answers = [post(server, lora=ref) for ref in ("civitai:2009", "civitai:2006", "civitai:2007", "civitai:2008")]
    answers.append(httpx.get(server.url + "metrics", timeout=TIMEOUT))
    sent = civitai.requests
    api = [r for r in sent if r.host.startswith("127.0.0.1")]
    elsewhere = [r for r in sent if not r.host.startswith("127.0.0.1")]
    assert api and all(r.authorization == f"Bearer {TOKEN}" for r in api)
    assert all(r.authorization is None for r in elsewhere)
    for answer in answers:
        assert TOKEN not in answer.text and TOKEN not in str(answer.headers)
    assert TOKEN not in caplog.text


def test_picking_a_finetunes_lora_notes_the_checkpoint_it_will_run_on():
    from engine.outcomes import ServedPool
    from engine.requests import ModelDefaults
    from families.sdxl import PONY_BASE
    from lora_catalog.entries import Family
    from serving.ui.pool_views import finetune_note

    defaults = ModelDefaults(steps=2, guidance=5.0, side=64, max_side=128)
    sdxl = ServedPool("stabilityai/stable-diffusion-xl-base-1.0", "tiny", "sdxl", defaults, True)
    pony = LoraEntry("civitai:1", None, "p", base_models=(PONY_BASE,), family=Family.SDXL, source="civitai")
    note = finetune_note((sdxl,), pony)
    assert note is not None and note.startswith("Trained for Pony, which no pool here serves: it runs on SDXL 1.0")
    assert "lora-note" in fmt.note_html(note)
    # Served by a pool of its own, or a LoRA of the family's base: nothing to say.
    assert finetune_note((sdxl, ServedPool(PONY_BASE, "me/pony", "sdxl", defaults, False)), pony) is None
    plain = LoraEntry("civitai:2", None, "s", base_models=(sdxl.base_model_id,), family=Family.SDXL, source="civitai")
    assert finetune_note((sdxl,), plain) is None
