"""The stand-in Hub, driven by the real huggingface_hub client (and diffusers' LoRA fetch)."""

from __future__ import annotations

import os
import sys

if "huggingface_hub" not in sys.modules:
    # conftest normally sets these (with HF_ENDPOINT): the client reads them once, at its first import.
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import json
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import numpy as np
import pytest
from huggingface_hub import HfApi, constants, file_download, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import _http
from safetensors.numpy import save as save_safetensors

from tests.support.standin_hub import HubSetupError, StandInHub

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
TOKEN = "hf_standin_secret"
LORA_CARD = f"""---
license: openrail++
base_model: {SDXL}
tags: [lora, text-to-image, stable-diffusion-xl]
library_name: diffusers
pipeline_tag: text-to-image
instance_prompt: pxl style
---
# Pixel LoRA
""".encode()


def _weights(**extra_metadata: str) -> bytes:
    tensors = {"unet.mid_block.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight": np.ones((4, 8), np.float32)}
    return save_safetensors(tensors, metadata={"format": "pt", **extra_metadata})


def _day(n: int) -> datetime:
    return datetime(2024, 1, n, 12, 0, tzinfo=UTC)


def _raw(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="module")
def api(hub: StandInHub) -> HfApi:
    if hub.url != constants.ENDPOINT:
        pytest.fail(f"huggingface_hub was imported with HF_ENDPOINT={constants.ENDPOINT}, not the hub's {hub.url}")
    return HfApi(token=False)


@pytest.fixture
def own_hub(tmp_path: Path) -> Iterator[StandInHub]:
    """A hub of this test's own, with a token and pages of 2 (the client reaches it with `endpoint=`)."""
    with StandInHub(tmp_path / "own-hub", token=TOKEN, page_size=2) as started:
        yield started


@pytest.fixture
def fault(hub: StandInHub) -> Iterator[StandInHub]:
    yield hub
    hub.set_fault(None)


@pytest.fixture
def no_client_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client sleeps 1-8 s between retries; the retries are the point here, not the wait."""
    fast_time = SimpleNamespace(sleep=lambda seconds: None, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(_http, "time", fast_time)
    monkeypatch.setattr(file_download, "time", fast_time)


@pytest.fixture(scope="module")
def catalog(hub: StandInHub) -> dict[str, str]:
    """Three repos of one author with distinct stats, dates and tags."""
    spec = {
        "sortco/alpha-LoRA": dict(downloads=30, likes=1, trending_score=5, created_at=_day(3), last_modified=_day(4)),
        "sortco/beta": dict(downloads=10, likes=3, trending_score=9, created_at=_day(1), last_modified=_day(9)),
        "sortco/gamma-lora": dict(downloads=20, likes=2, trending_score=1, created_at=_day(2), last_modified=_day(1)),
    }
    tags = {"sortco/alpha-LoRA": ["lora", "style"], "sortco/beta": ["style"], "sortco/gamma-lora": ["lora"]}
    return {
        repo_id: hub.add_repo(
            repo_id, {"README.md": b"# no card data", "w.safetensors": _weights()}, tags=tags[repo_id], **kw
        )
        for repo_id, kw in spec.items()
    }


def test_list_models_keeps_models_with_all_filter_tags(api: HfApi, catalog: dict[str, str]) -> None:
    assert [m.id for m in api.list_models(author="sortco", filter="style")] == ["sortco/alpha-LoRA", "sortco/beta"]
    both = api.list_models(author="sortco", filter=["style", "lora"])
    assert [m.id for m in both] == ["sortco/alpha-LoRA"]
    assert list(api.list_models(author="sortco", filter=["style", "no-such-tag"])) == []


def test_list_models_search_is_a_case_insensitive_substring_of_the_id(api: HfApi, catalog: dict[str, str]) -> None:
    assert [m.id for m in api.list_models(search="LORA", author="sortco")] == ["sortco/alpha-LoRA", "sortco/gamma-lora"]
    assert [m.id for m in api.list_models(search="co/bet")] == ["sortco/beta"]


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("downloads", ["alpha-LoRA", "gamma-lora", "beta"]),
        ("likes", ["beta", "gamma-lora", "alpha-LoRA"]),
        ("trending_score", ["beta", "alpha-LoRA", "gamma-lora"]),
        ("last_modified", ["beta", "alpha-LoRA", "gamma-lora"]),
        ("created_at", ["alpha-LoRA", "gamma-lora", "beta"]),
    ],
)
def test_list_models_sorts_descending_by_each_key(
    api: HfApi, catalog: dict[str, str], hub: StandInHub, sort: str, expected: list[str]
) -> None:
    assert [m.id.split("/")[1] for m in api.list_models(author="sortco", sort=sort)] == expected  # type: ignore[arg-type]
    # The same key in the spelling the client does not send, ascending.
    status, _, body = _raw(f"{hub.url}/api/models?author=sortco&sort={sort}&direction=1")
    assert status == 200
    assert [m["id"].split("/")[1] for m in json.loads(body)] == expected[::-1]


def test_list_models_rejects_unknown_sort_like_the_hub(hub: StandInHub, catalog: dict[str, str]) -> None:
    status, headers, body = _raw(f"{hub.url}/api/models?sort=stars")
    assert status == 400
    assert "sort='stars'" in headers["X-Error-Message"]
    assert "error" in json.loads(body)


def test_list_models_follows_link_pages(own_hub: StandInHub) -> None:
    for n in range(5):
        own_hub.add_repo(f"pager/m{n}", {"a.txt": b"%d" % n})
    api = HfApi(endpoint=own_hub.url, token=False)
    own_hub.clear_requests()
    assert [m.id for m in api.list_models(limit=None)] == [f"pager/m{n}" for n in range(5)]
    pages = own_hub.requests
    assert len(pages) == 3
    assert "cursor" not in pages[0].query
    assert all("cursor" in page.query for page in pages[1:])

    own_hub.clear_requests()
    assert len(list(api.list_models(limit=3))) == 3
    assert len(own_hub.requests) == 1  # the client's `limit` is the page size and it stops after it


def test_list_models_expand_returns_only_the_requested_fields(
    api: HfApi, hub: StandInHub, catalog: dict[str, str]
) -> None:
    hub.clear_requests()
    models = list(api.list_models(author="sortco", expand=["downloads", "tags"]))
    assert hub.requests[-1].query["expand"] == ["downloads", "tags"]
    assert {m.id: m.downloads for m in models} == {"sortco/alpha-LoRA": 30, "sortco/beta": 10, "sortco/gamma-lora": 20}
    assert all(m.likes is None and m.sha is None and m.tags for m in models)

    _, _, body = _raw(f"{hub.url}/api/models?author=sortco&expand[]=sha&expand[]=gated")
    assert {frozenset(row) for row in json.loads(body)} == {frozenset({"_id", "id", "modelId", "sha", "gated"})}


def test_list_models_lists_gated_repos_with_full_and_card_views(api: HfApi, hub: StandInHub) -> None:
    sha = hub.add_repo("gateco/locked", {"README.md": LORA_CARD}, gated="manual")
    [listed] = api.list_models(author="gateco")
    assert (listed.gated, listed.sha, listed.card_data) == ("manual", None, None)
    [full] = api.list_models(author="gateco", full=True)
    assert full.sha == sha
    assert [s.rfilename for s in full.siblings or []] == ["README.md"]
    [with_card] = api.list_models(author="gateco", cardData=True)
    assert with_card.card_data is not None and with_card.card_data["base_model"] == SDXL


def test_model_info_reports_card_tags_and_files(api: HfApi, hub: StandInHub) -> None:
    sha = hub.add_repo(
        "infoco/pixel",
        {"README.md": LORA_CARD, "pixel.safetensors": _weights()},
        downloads=7,
        likes=2,
        created_at=_day(5),
    )
    info = api.model_info("infoco/pixel", files_metadata=True)
    assert (info.id, info.author, info.sha, info.private, info.gated, info.disabled) == (
        "infoco/pixel",
        "infoco",
        sha,
        False,
        False,
        False,
    )
    assert (info.downloads, info.likes, info.created_at) == (7, 2, _day(5))
    assert (info.library_name, info.pipeline_tag) == ("diffusers", "text-to-image")
    assert info.tags == [
        "lora",
        "text-to-image",
        "stable-diffusion-xl",
        f"base_model:{SDXL}",
        f"base_model:adapter:{SDXL}",
        "license:openrail++",
    ]
    assert info.card_data is not None and info.card_data["instance_prompt"] == "pxl style"
    weights = {s.rfilename: s for s in info.siblings or []}["pixel.safetensors"]
    assert weights.size == len(_weights())
    assert weights.lfs is not None and weights.lfs.size == len(_weights())


def test_model_info_by_branch_and_by_sha(api: HfApi, hub: StandInHub) -> None:
    first = hub.add_repo("revco/model", {"a.txt": b"v1"}, last_modified=_day(1))
    second = hub.add_repo("revco/model", {"a.txt": b"v2"}, last_modified=_day(2))
    dev = hub.add_repo("revco/model", {"a.txt": b"dev", "b.txt": b"b"}, revision="dev")
    assert len({first, second, dev}) == 3
    assert api.model_info("revco/model").sha == second
    assert api.model_info("revco/model", revision="dev").sha == dev
    old = api.model_info("revco/model", revision=first)
    assert (old.sha, old.last_modified) == (first, _day(1))
    assert [b.name for b in api.list_repo_refs("revco/model").branches] == ["main", "dev"]
    only_sha = api.model_info("revco/model", revision="dev", expand=["sha"])
    assert (only_sha.sha, only_sha.downloads, only_sha.siblings) == (dev, None, None)


def test_malformed_card_override_is_served_as_given(api: HfApi, hub: StandInHub) -> None:
    card = {"base_model": 5, "widget": "not-a-list", "tags": ["lora"], "license": ["mit"]}
    hub.add_repo("cardco/odd", {"README.md": b"---\nlicense: mit\n---\n"}, card_data_override=card)
    info = api.model_info("cardco/odd")
    assert info.tags == ["lora"]  # no base_model or license tag from values that are not strings
    assert info.card_data is not None and info.card_data["base_model"] == 5
    assert info.widget_data == "not-a-list"


def test_list_repo_tree_folders_recursion_and_lfs(api: HfApi, hub: StandInHub) -> None:
    files = {"README.md": b"# t", "w.safetensors": _weights(), "sub/a.txt": b"a", "sub/deep/b.txt": b"bb"}
    sha = hub.add_repo("treeco/t", files)
    top = list(api.list_repo_tree("treeco/t"))
    assert [(type(e).__name__, e.path) for e in top] == [
        ("RepoFolder", "sub"),
        ("RepoFile", "README.md"),
        ("RepoFile", "w.safetensors"),
    ]
    weights = top[2]
    assert weights.size == len(_weights()) and weights.lfs is not None and weights.lfs.size == len(_weights())
    assert top[1].lfs is None
    assert [e.path for e in api.list_repo_tree("treeco/t", recursive=True)] == [
        "sub",
        "sub/deep",
        "README.md",
        "sub/a.txt",
        "sub/deep/b.txt",
        "w.safetensors",
    ]
    sub = list(api.list_repo_tree("treeco/t", path_in_repo="sub", revision=sha, expand=True))
    assert [e.path for e in sub] == ["sub/deep", "sub/a.txt"]
    assert sub[1].last_commit is not None and sub[1].last_commit.oid == sha


def test_hf_hub_download_returns_the_bytes_and_uses_the_cache(hub: StandInHub, tmp_path: Path) -> None:
    sha = hub.add_repo("dlco/files", {"dir/w.safetensors": _weights(), "notes.txt": b"hello"})
    hub.clear_requests()
    path = hf_hub_download("dlco/files", "dir/w.safetensors", cache_dir=tmp_path, token=False)
    assert Path(path).read_bytes() == _weights()
    assert [r.method for r in hub.requests] == ["HEAD", "GET"]

    hub.clear_requests()
    assert hf_hub_download("dlco/files", "dir/w.safetensors", cache_dir=tmp_path, token=False) == path
    assert [r.method for r in hub.requests] == ["HEAD"]

    hub.clear_requests()
    pinned = hf_hub_download("dlco/files", "dir/w.safetensors", revision=sha, cache_dir=tmp_path, token=False)
    assert pinned == path
    assert hub.requests == []  # a commit sha already in the cache needs no request at all


def test_hf_hub_download_by_sha_gets_the_old_commit(hub: StandInHub, tmp_path: Path) -> None:
    old = hub.add_repo("dlco/moving", {"a.txt": b"old"})
    hub.add_repo("dlco/moving", {"a.txt": b"new"})
    assert Path(
        hf_hub_download("dlco/moving", "a.txt", revision=old, cache_dir=tmp_path, token=False)
    ).read_bytes() == (b"old")
    assert Path(hf_hub_download("dlco/moving", "a.txt", cache_dir=tmp_path, token=False)).read_bytes() == b"new"


def test_resolve_headers_and_ranges(hub: StandInHub) -> None:
    sha = hub.add_repo("rangeco/r", {"model.safetensors": _weights(), "a.txt": b"0123456789"})
    status, headers, _ = _raw(hub.file_url("rangeco/r", "model.safetensors"), method="HEAD")
    assert status == 200
    assert headers["X-Repo-Commit"] == sha and headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Length"] == headers["X-Linked-Size"] == str(len(_weights()))
    assert headers["ETag"].startswith('"') and not any(name.lower().startswith("x-xet") for name in headers)

    status, headers, body = _raw(hub.file_url("rangeco/r", "a.txt"), {"Range": "bytes=2-4"})
    assert (status, headers["Content-Range"], body) == (206, "bytes 2-4/10", b"234")
    assert _raw(hub.file_url("rangeco/r", "a.txt"), {"Range": "bytes=-3"})[2] == b"789"
    assert _raw(hub.file_url("rangeco/r", "a.txt"), {"Range": "bytes=20-"})[0] == 416


def test_get_safetensors_metadata_reads_headers_by_range(api: HfApi, hub: StandInHub) -> None:
    hub.add_repo("stco/small", {"model.safetensors": _weights(note="tiny")})
    hub.clear_requests()
    meta = api.get_safetensors_metadata("stco/small")
    [(name, tensor)] = meta.files_metadata["model.safetensors"].tensors.items()
    assert tensor.shape == [4, 8] and tensor.dtype == "F32" and name.endswith("lora_A.weight")
    assert meta.files_metadata["model.safetensors"].metadata == {"format": "pt", "note": "tiny"}
    assert [r.headers.get("range") for r in hub.requests if r.method == "GET"] == ["bytes=0-100000"]

    big = _weights(padding="x" * 150_000)  # a header past the client's first 100 kB read
    hub.add_repo("stco/big", {"model.safetensors": big})
    hub.clear_requests()
    meta = api.get_safetensors_metadata("stco/big")
    assert len(meta.files_metadata["model.safetensors"].metadata["padding"]) == 150_000
    header_size = struct.unpack("<Q", big[:8])[0]
    assert [r.headers.get("range") for r in hub.requests if r.method == "GET"][-1] == f"bytes=8-{header_size + 7}"


def test_each_error_reaches_the_client_as_its_class(api: HfApi, hub: StandInHub, tmp_path: Path) -> None:
    hub.add_repo("errco/open", {"a.txt": b"a"})
    hub.add_repo("errco/gated", {"a.txt": b"a"}, gated=True)
    with pytest.raises(RepositoryNotFoundError) as missing:
        api.model_info("errco/nothing")
    assert missing.type is RepositoryNotFoundError and missing.value.response.status_code == 404
    with pytest.raises(RepositoryNotFoundError) as missing_download:
        hf_hub_download("errco/nothing", "a.txt", cache_dir=tmp_path, token=False)
    assert missing_download.type is RepositoryNotFoundError
    with pytest.raises(RevisionNotFoundError, match="Invalid rev id: nope"):
        api.model_info("errco/open", revision="nope")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("errco/open", "a.txt", revision="nope", cache_dir=tmp_path, token=False)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("errco/open", "b.txt", cache_dir=tmp_path, token=False)
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree("errco/open", path_in_repo="no-such-folder"))
    with pytest.raises(GatedRepoError, match="errco/gated is restricted"):
        hf_hub_download("errco/gated", "a.txt", cache_dir=tmp_path, token=False)
    assert api.model_info("errco/gated").gated == "auto"  # gated repos still describe themselves

    status, headers, body = _raw(hub.file_url("errco/open", "b.txt"))
    assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert json.loads(body) == {"error": headers["X-Error-Message"]}


def test_private_repos_need_the_token(own_hub: StandInHub, tmp_path: Path) -> None:
    own_hub.add_repo("privco/secret", {"a.txt": b"s"}, private=True)
    own_hub.add_repo("privco/open", {"a.txt": b"o"})
    anonymous = HfApi(endpoint=own_hub.url, token=False)
    member = HfApi(endpoint=own_hub.url, token=TOKEN)
    assert [m.id for m in anonymous.list_models(author="privco")] == ["privco/open"]
    with pytest.raises(RepositoryNotFoundError) as hidden:
        anonymous.model_info("privco/secret")
    assert hidden.value.response.status_code == 401

    own_hub.clear_requests()
    assert [m.id for m in member.list_models(author="privco")] == ["privco/open", "privco/secret"]
    assert member.model_info("privco/secret").private is True
    path = hf_hub_download("privco/secret", "a.txt", endpoint=own_hub.url, token=TOKEN, cache_dir=tmp_path)
    assert Path(path).read_bytes() == b"s"
    assert {r.headers.get("authorization") for r in own_hub.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in repr(own_hub.requests)

    with pytest.raises(HfHubHTTPError, match="Invalid credentials"):
        HfApi(endpoint=own_hub.url, token="hf_wrong").model_info("privco/open")


def test_repos_live_on_disk_and_a_new_hub_serves_them(tmp_path: Path) -> None:
    with StandInHub(tmp_path) as first:
        sha = first.add_repo("diskco/m", {"sub/a.txt": b"a"}, tags=["x"])
        meta = json.loads((first.repo_dir("diskco/m") / "meta.json").read_text())
        assert meta["branches"] == {"main": sha}
        assert (first.repo_dir("diskco/m") / "commits" / sha / "sub" / "a.txt").read_bytes() == b"a"
    with StandInHub(tmp_path) as second:
        info = HfApi(endpoint=second.url, token=False).model_info("diskco/m")
        assert (info.sha, info.tags) == (sha, ["x"])


def test_bad_setup_is_refused_with_what_is_accepted(hub: StandInHub) -> None:
    with pytest.raises(HubSetupError, match="repo id 'a/b/c' is not valid"):
        hub.add_repo("a/b/c", {"a.txt": b""})
    with pytest.raises(HubSetupError, match=r"'\.\./x' is not a relative POSIX path"):
        hub.add_repo("setupco/m", {"../x": b""})
    with pytest.raises(HubSetupError, match="fault 'flaky' is not known; accepted: None or one of down"):
        hub.set_fault("flaky")


def test_fault_down_hangs_up(api: HfApi, fault: StandInHub, tmp_path: Path) -> None:
    fault.add_repo("faultco/down", {"a.txt": b"a"})
    fault.set_fault("down")
    with pytest.raises(httpx2.RemoteProtocolError):
        api.model_info("faultco/down")
    with pytest.raises(httpx2.RemoteProtocolError):
        hf_hub_download("faultco/down", "a.txt", cache_dir=tmp_path, token=False)


def test_fault_error500_is_retried_then_raised(api: HfApi, fault: StandInHub, no_client_sleep: None) -> None:
    fault.add_repo("faultco/e500", {"a.txt": b"a"})
    fault.set_fault("error500")
    with pytest.raises(HfHubHTTPError, match="Internal Error") as raised:
        api.model_info("faultco/e500")
    assert raised.value.response.status_code == 500
    fault.clear_requests()
    with pytest.raises(HfHubHTTPError, match="Internal Error"):
        list(api.list_models(author="faultco"))
    assert len(fault.requests) == 6  # the client's pager retries 5 times


def test_fault_slow_answers_late(api: HfApi, fault: StandInHub) -> None:
    fault.add_repo("faultco/slow", {"a.txt": b"a"})
    fault.set_fault("slow", delay_s=0.05)
    assert api.model_info("faultco/slow").id == "faultco/slow"
    fault.set_fault("slow", delay_s=5)
    with pytest.raises(httpx2.ReadTimeout):
        api.model_info("faultco/slow", timeout=0.2)


def test_fault_malformed_json_breaks_api_calls_only(api: HfApi, fault: StandInHub, tmp_path: Path) -> None:
    fault.add_repo("faultco/json", {"a.txt": b"a"})
    fault.set_fault("malformed_json")
    with pytest.raises(json.JSONDecodeError):
        api.model_info("faultco/json")
    assert Path(hf_hub_download("faultco/json", "a.txt", cache_dir=tmp_path, token=False)).read_bytes() == b"a"


def test_fault_truncate_cuts_every_download(fault: StandInHub, tmp_path: Path, no_client_sleep: None) -> None:
    fault.add_repo("faultco/cut", {"w.bin": bytes(range(256)) * 4})
    fault.set_fault("truncate")
    fault.clear_requests()
    with pytest.raises(httpx2.RemoteProtocolError):
        hf_hub_download("faultco/cut", "w.bin", cache_dir=tmp_path, token=False)
    # Half a file under the client's 10 MB read chunk never reaches its disk: each retry starts again.
    assert [r.headers.get("range") for r in fault.requests if r.method == "GET"] == [None] * 6


def test_fault_limited_to_paths(api: HfApi, fault: StandInHub, tmp_path: Path, no_client_sleep: None) -> None:
    fault.add_repo("faultco/scoped", {"a.txt": b"a"})
    fault.set_fault("error500", paths="/resolve/")
    assert api.model_info("faultco/scoped").id == "faultco/scoped"
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download("faultco/scoped", "a.txt", cache_dir=tmp_path, token=False)


def test_diffusers_fetches_a_lora_by_weight_name(hub: StandInHub) -> None:
    loaders = pytest.importorskip("diffusers.loaders")
    hub.add_repo("diffco/pixel", {"README.md": LORA_CARD, "pixel_lora.safetensors": _weights()})
    state: Any = loaders.StableDiffusionXLLoraLoaderMixin.lora_state_dict(
        "diffco/pixel", weight_name="pixel_lora.safetensors"
    )
    state_dict = state[0] if isinstance(state, tuple) else state
    assert [tuple(t.shape) for t in state_dict.values()] == [(4, 8)]
