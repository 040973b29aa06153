"""HubSource against a stand-in Hub: listing (filters, sorts, paging, bad cards) and custom-LoRA resolution."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import yaml
from huggingface_hub import constants
from safetensors.numpy import save

from lora_catalog import (
    AmbiguousWeightsError,
    Family,
    GatedLoraError,
    HeaderError,
    HubSource,
    HubUnavailableError,
    InvalidRepoIdError,
    InvalidRequestError,
    InvalidWeightNameError,
    LoraNotFoundError,
    NoSafetensorsError,
    PickleOnlyError,
)
from tests.support.standin_hub import StandInHub
from tests.support.waits import wait_until

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
TOKEN = "hf_catalog_test_token"
NS = "cat-hub"


def card(base: object = SDXL, **fields: object) -> bytes:
    data = {"tags": ["lora", "text-to-image"], **fields}
    if base is not None:
        data["base_model"] = base
    return f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n# A LoRA\n".encode()


def weights(**metadata: str) -> bytes:
    name = "lora_unet_input_blocks_4_1_transformer_blocks_1_attn1_to_q.lora_down.weight"
    return save({name: np.ones((4, 8), np.float32)}, metadata={"ss_base_model_version": "sdxl_base_v1-0", **metadata})


def when(day: int) -> datetime:
    return datetime(2026, 1, day, tzinfo=UTC)


# name -> (downloads, likes, trending, last-modified day); all distinct so every sort has one right order.
LISTED = {
    "pixel-xl": (500, 20, 5, 3),
    "watercolor-xl": (400, 90, 1, 1),
    "neon-xl": (300, 10, 70, 9),
    "bad-int-xl": (200, 40, 20, 4),
    "bad-list-xl": (100, 30, 30, 5),
    "pickle-xl": (50, 5, 2, 6),
    "empty-xl": (40, 4, 3, 2),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    with StandInHub(tmp_path_factory.mktemp("catalog-hub"), token=TOKEN) as started:
        repos: dict[str, tuple[dict[str, bytes], dict[str, object]]] = {
            "pixel-xl": (
                {
                    "README.md": card(
                        license="openrail++",
                        instance_prompt="pixel art",
                        widget=[{"text": "a cat, pixel art", "output": {"url": "images/cat.png"}}],
                    ),
                    "pytorch_lora_weights.safetensors": weights(ss_output_name="pixel"),
                    "images/cat.png": b"\x89PNG fake",
                },
                {},
            ),
            "watercolor-xl": (
                {
                    "README.md": card([SDXL], license="cc-by-nc-4.0", widget=[{"text": "a watercolor fox"}]),
                    "watercolor.safetensors": weights(),
                    "preview.jpg": b"jpg",
                },
                {},
            ),
            "neon-xl": (
                {
                    "README.md": card(license="other", license_name="flux-1-dev-non-commercial-license"),
                    "a.safetensors": weights(),
                    "b.safetensors": weights(),
                },
                {},
            ),
            "bad-int-xl": (
                {"README.md": b"# no front matter", "x.safetensors": weights()},
                {
                    "card_data_override": {"base_model": 5, "instance_prompt": 7, "widget": "nope", "license": 3},
                    "tags": ["lora", f"base_model:adapter:{SDXL}"],
                },
            ),
            "bad-list-xl": (
                {"README.md": b"#", "x.safetensors": weights()},
                {
                    "card_data_override": {
                        "base_model": [SDXL, 7, {"x": 1}],
                        "widget": ["s", {"output": {"url": "../../etc/passwd"}}, {"output": None}],
                    },
                    "tags": ["lora"],
                },
            ),
            "pickle-xl": ({"README.md": card(), "adapter_model.bin": b"pickle", "model.ckpt": b"ckpt"}, {}),
            "empty-xl": ({"README.md": card(), "notes.txt": b"soon"}, {}),
        }
        for name, (files, extra) in repos.items():
            downloads, likes, trending, day = LISTED[name]
            started.add_repo(
                f"{NS}/{name}",
                files,
                downloads=downloads,
                likes=likes,
                trending_score=trending,
                last_modified=when(day),
                **extra,  # type: ignore[arg-type]
            )
        # Never listed for SDXL: another family, gated, private, not a LoRA.
        started.add_repo(f"{NS}/sd15-lora", {"README.md": card(SD15), "x.safetensors": weights()}, downloads=9999)
        started.add_repo(f"{NS}/gated-xl", {"README.md": card(), "x.safetensors": weights()}, gated="manual")
        started.add_repo(f"{NS}/private-xl", {"README.md": card(), "x.safetensors": weights()}, private=True)
        started.add_repo(f"{NS}/not-a-lora", {"README.md": card(tags=["text-to-image"]), "x.safetensors": weights()})
        yield started


@pytest.fixture
def source(clean_hub: StandInHub) -> HubSource:
    return HubSource(endpoint=clean_hub.url, timeout_s=5.0)


def closed_port_url() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def names(entries: list) -> list[str]:
    return [e.ref.split("/", 1)[1] for e in entries]


def test_lists_only_public_ungated_loras_of_the_base(source: HubSource) -> None:
    listed = source.list_loras(SDXL, limit=100)
    assert sorted(names(listed)) == sorted(LISTED)
    assert all(e.family is Family.SDXL and e.source == "hub" for e in listed)


@pytest.mark.parametrize(
    ("sort", "column"),
    [("downloads", 0), ("likes", 1), ("trending", 2), ("recent", 3)],
)
def test_each_sort_order(source: HubSource, clean_hub: StandInHub, sort: str, column: int) -> None:
    listed = source.list_loras(SDXL, sort=sort, limit=100)  # type: ignore[arg-type]
    assert names(listed) == sorted(LISTED, key=lambda n: LISTED[n][column], reverse=True)
    sent = {"downloads": "downloads", "likes": "likes", "trending": "trendingScore", "recent": "lastModified"}[sort]
    assert clean_hub.requests[0].query["sort"] == [sent]


def test_search_is_done_by_the_hub(source: HubSource, clean_hub: StandInHub) -> None:
    assert names(source.list_loras(SDXL, search="  water ")) == ["watercolor-xl"]
    assert clean_hub.requests[0].query["search"] == ["water"]
    assert source.list_loras(SDXL, search="zzz") == []


def test_paging_costs_one_request_per_page_with_everything_expanded(clean_hub: StandInHub) -> None:
    source = HubSource(endpoint=clean_hub.url, page_size=2)
    listed = source.list_loras(SDXL, limit=100)
    assert len(listed) == len(LISTED)
    requests = clean_hub.requests
    assert len(requests) == math.ceil(len(LISTED) / 2)
    assert all(r.path == "/api/models" for r in requests)
    first = requests[0].query
    assert first["filter"] == ["lora", f"base_model:adapter:{SDXL}"]
    assert {"cardData", "siblings", "gated", "private", "sha", "lastModified"} <= set(first["expand"])
    assert all("cursor" in r.query for r in requests[1:])


def test_limit_stops_paging(clean_hub: StandInHub) -> None:
    source = HubSource(endpoint=clean_hub.url, page_size=2)
    assert names(source.list_loras(SDXL, limit=3)) == ["pixel-xl", "watercolor-xl", "neon-xl"]
    assert len(clean_hub.requests) == 2


def test_entry_fields_from_cards(source: HubSource, hub: StandInHub) -> None:
    by_name = {e.title: e for e in source.list_loras(SDXL, limit=100)}
    pixel = by_name["pixel-xl"]
    assert pixel.trigger_words == ("pixel art",)
    assert pixel.preview_urls == (hub.file_url(f"{NS}/pixel-xl", "images/cat.png", pixel.sha or ""),)
    assert (pixel.license, pixel.non_commercial) == ("openrail++", False)
    assert pixel.weight_name == "pytorch_lora_weights.safetensors"
    assert pixel.last_modified == when(3)
    assert pixel.base_models == (SDXL,)
    water = by_name["watercolor-xl"]
    assert (water.license, water.non_commercial) == ("cc-by-nc-4.0", True)
    assert water.trigger_words == ("a watercolor fox",)
    assert water.preview_urls == (hub.file_url(f"{NS}/watercolor-xl", "preview.jpg", water.sha or ""),)
    assert water.weight_name == "watercolor.safetensors"
    neon = by_name["neon-xl"]
    assert (neon.license, neon.non_commercial) == ("flux-1-dev-non-commercial-license", True)
    assert neon.weight_name is None
    assert by_name["pickle-xl"].weight_name is None


def test_malformed_cards_degrade_instead_of_breaking_the_list(source: HubSource) -> None:
    by_name = {e.title: e for e in source.list_loras(SDXL, limit=100)}
    bad_int, bad_list = by_name["bad-int-xl"], by_name["bad-list-xl"]
    assert (bad_int.base_models, bad_int.family) == ((SDXL,), Family.SDXL)
    assert (bad_int.trigger_words, bad_int.preview_urls, bad_int.license) == ((), (), None)
    assert (bad_list.base_models, bad_list.preview_urls) == ((SDXL,), ())


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("down", r"could not be reached while listing LoRAs"),
        ("error500", r"answered HTTP 500 while listing LoRAs"),
        ("malformed_json", r"answered malformed JSON while listing LoRAs"),
    ],
)
def test_listing_failures_are_hub_unreachable(
    source: HubSource, clean_hub: StandInHub, fault: str, message: str
) -> None:
    clean_hub.set_fault(fault)
    with pytest.raises(HubUnavailableError, match=message):
        source.list_loras(SDXL)
    assert len(clean_hub.requests) == 1  # no retries with back-off: the catalogue falls back at once


def test_slow_hub_times_out(clean_hub: StandInHub) -> None:
    clean_hub.set_fault("slow", delay_s=3.0)
    source = HubSource(endpoint=clean_hub.url, timeout_s=0.3)
    with pytest.raises(HubUnavailableError, match=r"did not answer within 0.3 s while listing"):
        source.list_loras(SDXL)


def test_closed_port_is_hub_unreachable() -> None:
    source = HubSource(endpoint=closed_port_url(), timeout_s=2.0)
    with pytest.raises(HubUnavailableError, match=r"could not be reached"):
        source.list_loras(SDXL)
    with pytest.raises(HubUnavailableError, match=r"could not be reached while looking up LoRA 'o/n'"):
        source.resolve("o/n")


def test_huggingface_hub_offline_mode_is_hub_unreachable(
    source: HubSource, clean_hub: StandInHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnavailableError, match=r"offline mode \(HF_HUB_OFFLINE\) is on while listing"):
        source.list_loras(SDXL)
    with pytest.raises(HubUnavailableError, match=r"offline mode .* while looking up LoRA"):
        source.resolve(f"{NS}/pixel-xl")
    assert clean_hub.requests == []


def test_bad_listing_arguments(source: HubSource) -> None:
    with pytest.raises(InvalidRequestError, match=r"sort 'stars' is not accepted; accepted: downloads, likes"):
        source.list_loras(SDXL, sort="stars")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match=r"limit=0 is not accepted"):
        source.list_loras(SDXL, limit=0)
    with pytest.raises(InvalidRepoIdError, match=r"base model id '\.\./x' is not accepted"):
        source.list_loras("../x")


def test_resolve_fills_weight_size_and_sha(source: HubSource, hub: StandInHub) -> None:
    entry = source.resolve(f"{NS}/pixel-xl")
    assert entry.weight_name == "pytorch_lora_weights.safetensors"
    assert entry.weight_size == len(weights(ss_output_name="pixel"))
    assert entry.sha is not None and len(entry.sha) == 40
    assert entry.trigger_words == ("pixel art",)
    named = source.resolve(f"{NS}/neon-xl", weight_name="b.safetensors")
    assert (named.weight_name, named.non_commercial) == ("b.safetensors", True)


def test_resolve_is_cached_per_repo_revision_and_file(clean_hub: StandInHub) -> None:
    now = [1000.0]
    source = HubSource(endpoint=clean_hub.url, cache_ttl_s=600.0, clock=lambda: now[0])
    first = source.resolve(f"{NS}/watercolor-xl")
    assert source.resolve(f"{NS}/watercolor-xl") is first
    assert len(clean_hub.requests) == 1
    now[0] += 601.0  # a branch can move: past the TTL it is answered at once and looked up again in the background
    assert source.resolve(f"{NS}/watercolor-xl") is first
    assert source.stale_warning(f"{NS}/watercolor-xl") is not None
    wait_until(lambda: len(clean_hub.requests) >= 2, "the background lookup")
    assert len(clean_hub.requests) == 2
    wait_until(lambda: source.stale_warning(f"{NS}/watercolor-xl") is None, "the entry fresh again")
    pinned = source.resolve(f"{NS}/watercolor-xl", revision=first.sha)
    now[0] += 10**7  # a commit never changes: cached for good
    assert source.resolve(f"{NS}/watercolor-xl", revision=first.sha) is pinned
    assert len(clean_hub.requests) == 3


def test_errors_are_not_cached(source: HubSource, clean_hub: StandInHub) -> None:
    for _ in range(2):
        with pytest.raises(LoraNotFoundError, match=rf"LoRA repo '{NS}/nope' was not found on the Hub"):
            source.resolve(f"{NS}/nope")
    assert len(clean_hub.requests) == 2


@pytest.mark.parametrize(
    "bad",
    ["../etc/passwd", "/etc/passwd", "https://huggingface.co/a/b", "a\\b", "", "a/" + "b" * 95, "no-owner"],
)
def test_resolve_rejects_path_like_ids_before_any_request(source: HubSource, clean_hub: StandInHub, bad: str) -> None:
    with pytest.raises(InvalidRepoIdError, match=r"accepted form: 'owner/name'") as caught:
        source.resolve(bad)
    assert repr(bad) in str(caught.value)
    assert clean_hub.requests == []


def test_resolve_errors(source: HubSource, clean_hub: StandInHub) -> None:
    with pytest.raises(LoraNotFoundError, match=rf"revision 'v9' of LoRA repo '{NS}/pixel-xl' was not found"):
        source.resolve(f"{NS}/pixel-xl", revision="v9")
    with pytest.raises(LoraNotFoundError, match=r"file 'c.safetensors' was not found .* 'a.safetensors', 'b.saf"):
        source.resolve(f"{NS}/neon-xl", weight_name="c.safetensors")
    with pytest.raises(InvalidWeightNameError, match=r"weight_name 'adapter_model.bin' is a pickle file"):
        source.resolve(f"{NS}/pickle-xl", weight_name="adapter_model.bin")
    with pytest.raises(GatedLoraError, match=rf"LoRA repo '{NS}/gated-xl' is gated \(manual\)"):
        source.resolve(f"{NS}/gated-xl")
    with pytest.raises(LoraNotFoundError, match=rf"'{NS}/private-xl' was not found on the Hub \(or it is private\)"):
        source.resolve(f"{NS}/private-xl")
    with pytest.raises(PickleOnlyError, match=r"only pickle weights \('adapter_model.bin', 'model.ckpt'\).*never unp"):
        source.resolve(f"{NS}/pickle-xl")
    with pytest.raises(NoSafetensorsError, match=rf"'{NS}/empty-xl' holds no .safetensors file"):
        source.resolve(f"{NS}/empty-xl")
    with pytest.raises(AmbiguousWeightsError, match=r"several .safetensors files .* pass weight_name") as caught:
        source.resolve(f"{NS}/neon-xl")
    assert caught.value.candidates == ("a.safetensors", "b.safetensors")


def test_private_repo_seen_with_a_token_is_refused_as_private(clean_hub: StandInHub) -> None:
    source = HubSource(endpoint=clean_hub.url, token=TOKEN)
    with pytest.raises(LoraNotFoundError, match=rf"LoRA repo '{NS}/private-xl' is private; this Space serves public"):
        source.resolve(f"{NS}/private-xl")
    assert clean_hub.requests[0].headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("fault", "message"),
    [("error500", r"answered HTTP 500 while looking up"), ("malformed_json", r"answered malformed JSON while look")],
)
def test_resolve_hub_failures(source: HubSource, clean_hub: StandInHub, fault: str, message: str) -> None:
    clean_hub.set_fault(fault)
    with pytest.raises(HubUnavailableError, match=message):
        source.resolve(f"{NS}/pixel-xl")


def test_remote_header_is_read_with_a_range_request(source: HubSource, clean_hub: StandInHub) -> None:
    entry = source.resolve(f"{NS}/pixel-xl")
    header = source.read_remote_header(entry)
    assert header.metadata["ss_output_name"] == "pixel"
    assert header.data_start + header.data_size == entry.weight_size
    ranges = [r.headers.get("range") for r in clean_hub.requests if "/resolve/" in r.path]
    # The 8-byte prefix (where the data starts, the file's size), then huggingface_hub's read of the header.
    assert ranges == ["bytes=0-7", "bytes=0-100000"]
    clean_hub.clear_requests()
    assert source.read_remote_header(entry) is header
    assert clean_hub.requests == []


def test_remote_header_larger_than_the_first_read(hub: StandInHub, source: HubSource) -> None:
    big = weights(notes="x" * 150_000)
    hub.add_repo(f"{NS}/big-header", {"README.md": card(), "pytorch_lora_weights.safetensors": big})
    hub.clear_requests()
    header = source.read_remote_header(source.resolve(f"{NS}/big-header"))
    assert len(header.metadata["notes"]) == 150_000
    ranges = [r.headers.get("range") for r in hub.requests if "/resolve/" in r.path]
    assert ranges[0] == "bytes=0-7" and len(ranges) == 3 and ranges[2].startswith("bytes=8-")


def test_remote_header_of_a_lying_file(hub: StandInHub, source: HubSource, tmp_path: Path) -> None:
    content = bytearray(weights())
    hub.add_repo(f"{NS}/lying", {"README.md": card(), "pytorch_lora_weights.safetensors": bytes(content[:-20])})
    with pytest.raises(HeaderError, match=rf"{NS}/lying/pytorch_lora_weights.safetensors: .* file truncated"):
        source.read_remote_header(source.resolve(f"{NS}/lying"))
