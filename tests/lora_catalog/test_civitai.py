"""Civitai as a LoRA source, against a stand-in of its API: the forms users paste, the base-model table, the
policy (LoRAs only, NSFW ceiling, early access, one safetensors file), downloads from its own hosts only with the
SHA256 checked, the token kept to its API host, and answers cached stale-while-revalidate."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lora_catalog.civitai.bases import CIVITAI_BASES, civitai_base
from lora_catalog.civitai.refs import CivitaiRef, parse_civitai
from lora_catalog.civitai.source import CivitaiSource
from lora_catalog.civitai.versions import NsfwLevel, parse_nsfw_level
from lora_catalog.entries import Family, LoraEntry
from lora_catalog.errors import (
    AmbiguousWeightsError,
    CivitaiUnavailableError,
    ContentPolicyError,
    DownloadRefusedError,
    InvalidRequestError,
    LoraNotFoundError,
    NotALoraError,
    PickleOnlyError,
    RestrictedLoraError,
)
from tests.support.standin_civitai import MISSING, StandInCivitai

TOKEN = "civitai-secret-3f9a1c"
DATA = b"not really a LoRA, but bytes with a hash" * 50
GRAIN = ("film_grain_high_noise.safetensors", "film_grain_low_noise.safetensors")


@pytest.fixture(scope="module")
def civitai() -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        started.add_lora(101, DATA, model_id=10, trained_words=("civstyle", "glow"), clip_skip=2,
                         settings={"strength": 0.8, "minStrength": 0.5, "maxStrength": 1.2},
                         images=[{"url": "https://image.example/pg.jpeg", "nsfwLevel": 1, "type": "image"},
                                 {"url": "https://image.example/r.jpeg", "nsfwLevel": 4, "type": "image"},
                                 # Not raster, or not https: never a preview (Gradio fetches an .svg server-side).
                                 {"url": "https://attacker.example/t.svg", "nsfwLevel": 1, "type": "image"},
                                 {"url": "http://image.example/plain.jpeg", "nsfwLevel": 1, "type": "image"},
                                 {"url": "data:image/png;base64,AAAA", "nsfwLevel": 1, "type": "image"},
                                 # A raster path with a query or fragment Gradio's SVG rule reads as an .svg.
                                 {"url": "https://image.example/a.png?.svg", "nsfwLevel": 1, "type": "image"},
                                 {"url": "https://image.example/b.png#.svg", "nsfwLevel": 1,
                                  "type": "image"}])  # fmt: skip
        # Model 20: two published versions, the later one published last.
        started.add_lora(201, DATA, model_id=20, published_at="2024-01-01T00:00:00.000Z")
        started.add_lora(202, DATA + b"2", model_id=20, published_at="2025-06-01T00:00:00.000Z")
        started.add_lora(301, DATA, model_type="Checkpoint")
        started.add_lora(302, DATA, model_type="TextualInversion")
        started.add_lora(303, DATA, nsfw=True, nsfw_level=1)
        started.add_lora(304, DATA, nsfw_level=1 | 4)
        started.add_lora(305, DATA, availability="EarlyAccess", early_access_ends="2999-01-01T00:00:00.000Z")
        pickle = {"id": 1, "name": "style.pt", "type": "Model", "metadata": {"format": "PickleTensor"},
                  "hashes": {"SHA256": "0" * 64}, "downloadUrl": "x", "sizeKB": 1}  # fmt: skip
        started.add_lora(306, DATA, extra_files=[pickle])
        training = {**pickle, "id": 2, "name": "data.zip", "type": "Training Data", "metadata": {"format": "Other"}}
        started.add_lora(307, DATA, extra_files=[training, {**pickle, "name": "other.safetensors", "primary": False,
                                                           "metadata": {"format": "SafeTensor"}}])  # fmt: skip
        started.add_lora(401, DATA, download="elsewhere")
        started.add_lora(402, DATA, download="login")
        started.add_lora(403, DATA, download="401")
        started.add_lora(404, DATA, download="403")
        started.add_lora(405, DATA, download="tampered")
        started.add_lora(406, DATA, download="direct")
        started.add_lora(501, DATA, base_model="Pony", trained_words=())
        # A high- and a low-noise file (the primary one low) on SDXL, and on Wan 2.2 A14B.
        for version, base in ((601, "SDXL 1.0"), (602, "Wan Video 2.2 T2V-A14B"), (603, "Wan Video 2.2 I2V-A14B")):
            started.add_lora(version, DATA, name=GRAIN[1], base_model=base, more={GRAIN[0]: DATA + b"high"})
        yield started


@pytest.fixture
def source(civitai) -> Iterator[CivitaiSource]:
    made = CivitaiSource(civitai.url, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    civitai.clear_requests()
    yield made
    made.close()


# -- the forms a user pastes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "model", "version"),
    [
        ("civitai:123", None, 123),
        ("CIVITAI:123", None, 123),
        ("civitai:models/45", 45, None),
        ("https://civitai.com/models/45", 45, None),
        ("https://civitai.com/models/45/", 45, None),
        ("https://civitai.com/models/45/pixel-art-xl", 45, None),
        ("https://civitai.com/models/45/pixel-art-xl?modelVersionId=123", 45, 123),
        ("https://www.civitai.com/models/45?modelVersionId=123", 45, 123),
        ("https://civitai.green/models/45?modelVersionId=123", 45, 123),
        ("https://civitai.com/api/download/models/123", None, 123),
        ("https://civitai.com/api/download/models/123?type=Model&format=SafeTensor", None, 123),
        ("urn:air:sdxl:lora:civitai:45@123", 45, 123),
        ("urn:air:sdxl:lora:civitai:45@123.safetensor", 45, 123),
        ("urn:air:flux1:lora:civitai:45", 45, None),
        ("air:sd1:lora:civitai:45@123", 45, 123),
        ("sdxl:lora:civitai:45@123", 45, 123),
        ("  civitai:123  ", None, 123),
    ],
)
def test_every_accepted_form_names_one_version_or_model(text, model, version):
    parsed = parse_civitai(text)
    assert parsed == CivitaiRef(model, version)
    # The canonical form reads back as itself: the version is the identity; a model alone means its latest.
    assert parse_civitai(parsed.canonical).canonical == parsed.canonical
    assert parsed.canonical == (f"civitai:{version}" if version else f"civitai:models/{model}")


@pytest.mark.parametrize("text", ["owner/name", "local:x.safetensors", "https://huggingface.co/a/b", "", "civitai"])
def test_other_references_are_not_civitai_ones(text):
    assert parse_civitai(text) is None


@pytest.mark.parametrize(
    ("text", "error", "named"),
    [
        ("urn:air:sdxl:checkpoint:civitai:45@123", NotALoraError, "a checkpoint"),
        ("urn:air:sd1:embedding:civitai:45@123", NotALoraError, "an embedding"),
        ("urn:air:sdxl:lora:civitai:45@123+9", InvalidRequestError, "names a file"),
        ("urn:air:sdxl:lora:civitai:45@123.ckpt", InvalidRequestError, "pickle"),
        ("urn:air:sdxl:lora:huggingface:45", InvalidRequestError, "not a Civitai AIR"),
        ("civitai:0", InvalidRequestError, "not accepted"),
        ("civitai:abc", InvalidRequestError, "not accepted"),
        ("civitai:99999999999", InvalidRequestError, "not accepted"),
        ("http://civitai.com/models/45", InvalidRequestError, "only https"),
        ("https://civitai.com:8443/models/45", InvalidRequestError, "only https"),
        ("https://civitai.com/models/45?modelVersionId=1&modelVersionId=2", InvalidRequestError, "twice"),
        ("https://civitai.com/models/45?sort=new", InvalidRequestError, "unknown query key"),
        ("https://civitai.com/user/someone", InvalidRequestError, "not a model page or a download link"),
        ("https://civitai.com/models/45?modelVersionId=x", InvalidRequestError, "holds the id"),
    ],
)
def test_malformed_or_other_civitai_references_are_refused_naming_them(text, error, named):
    with pytest.raises(error, match=named) as caught:
        parse_civitai(text)
    assert caught.value.status == 400
    assert "accepted: " in str(caught.value)


def test_a_link_carrying_a_token_is_refused_without_echoing_it():
    with pytest.raises(InvalidRequestError, match="carries a token") as caught:
        parse_civitai(f"https://civitai.com/api/download/models/123?token={TOKEN}")
    assert TOKEN not in str(caught.value)


# -- the base-model table: a test per entry -------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "family", "finetune"),
    [
        ("SDXL 1.0", Family.SDXL, False),
        ("Pony", Family.SDXL, True),
        ("Illustrious", Family.SDXL, True),
        ("NoobAI", Family.SDXL, True),
        ("SD 1.5", Family.SD15, False),
        ("Flux.1 D", Family.FLUX, False),
        ("Flux.1 S", Family.FLUX, False),
        ("Flux.1 Krea", Family.FLUX, False),
        ("ZImageTurbo", Family.ZIMAGE, False),
        ("ZImageBase", Family.ZIMAGE, False),
        ("Flux.2 Klein 4B", Family.FLUX2, False),
        ("Flux.2 Klein 9B-base", Family.FLUX2, False),
        ("Qwen", Family.QWEN_IMAGE, False),
        ("Flux.2 D", Family.FLUX2_DEV, False),
        ("Wan Video 1.3B t2v", Family.WAN, False),
        ("Wan Video 14B t2v", Family.WAN, False),
        ("Wan Video 2.2 TI2V-5B", Family.WAN, False),
        ("Wan Video 14B i2v 480p", Family.WAN_I2V, False),
        ("Wan Video 14B i2v 720p", Family.WAN_I2V, False),
        ("Wan Video 2.2 T2V-A14B", Family.WAN22, False),
        ("Wan Video 2.2 I2V-A14B", Family.WAN22_I2V, False),
        ("Chroma", Family.CHROMA, False),
        ("LTXV2", Family.LTX2, False),
        ("Krea 2", Family.KREA2, False),
    ],
)
def test_each_civitai_base_maps_to_its_family(label, family, finetune):
    base = civitai_base(label)
    assert base is not None and base.family is family and base.finetune is finetune
    assert civitai_base(label.upper()) == base
    # The base it stands for is one routing knows, of the same family.
    from lora_catalog.bases import family_of_base

    assert family_of_base(base.base_model_id) is family


def test_the_table_has_exactly_those_entries_and_the_rest_maps_to_nothing():
    assert [b.label for b in CIVITAI_BASES] == [
        "SD 1.5", "SDXL 1.0", "Pony", "Illustrious", "NoobAI", "Flux.1 D", "Flux.1 S", "Flux.1 Krea",
        "Wan Video 14B i2v 480p", "Wan Video 14B i2v 720p", "Wan Video 1.3B t2v", "Wan Video 14B t2v",
        "Wan Video 2.2 TI2V-5B", "Flux.1 Kontext", "Wan Video 2.2 T2V-A14B",
        "Wan Video 2.2 I2V-A14B", "Qwen", "Chroma", "LTXV2", "ZImageTurbo", "ZImageBase", "Flux.2 D",
        "Flux.2 Klein 4B", "Flux.2 Klein 9B", "Flux.2 Klein 4B-base", "Flux.2 Klein 9B-base", "Krea 2",
    ]  # fmt: skip
    # Wan 2.5 is not served yet.
    unserved = ("Wan Video 2.5 T2V", "Wan Video 2.5 I2V")
    for other in ("SD 3.5", "Hunyuan Video", "Wan Video", *unserved, "SDXL Turbo", "Other", ""):
        assert civitai_base(other) is None


def test_nsfw_levels_are_read_by_name():
    assert parse_nsfw_level("pg-13") is NsfwLevel.PG13
    assert parse_nsfw_level("XXX") is NsfwLevel.XXX
    assert NsfwLevel.PG13.allowed_bits == 3
    with pytest.raises(ValueError, match="accepted: PG, PG13, R, X, XXX"):
        parse_nsfw_level("adult")


# -- resolving through the API ------------------------------------------------------------------------


def test_a_version_resolves_with_its_metadata(source, civitai):
    resolved = source.resolve("https://civitai.com/models/10?modelVersionId=101")
    assert resolved.version.version_id == 101 and resolved.version.base_model == "SDXL 1.0"
    assert resolved.file.sha256 == hashlib.sha256(DATA).hexdigest()
    assert resolved.file.size == len(DATA)
    entry = source.entry("civitai:101")
    assert entry.ref == "civitai:101" and entry.source == "civitai"
    assert entry.trigger_words == ("civstyle", "glow")
    assert entry.family is Family.SDXL and entry.base_models == ("stabilityai/stable-diffusion-xl-base-1.0",)
    # Its page's clipSkip (A1111's count) is the LoRA's recommended CLIP skip, as diffusers counts it.
    assert entry.hints.clip_skip == 1 and "Civitai page (clipSkip 2)" in (entry.hints.source("clip_skip") or "")
    assert dict(entry.recommended) == {"strength": 0.8, "min_strength": 0.5, "max_strength": 1.2}
    # Only the https raster previews rated within the ceiling are shown.
    assert entry.preview_urls == ("https://image.example/pg.jpeg",)
    assert entry.page_url == f"{civitai.url}/models/10?modelVersionId=101"
    assert LoraEntry.from_json(entry.to_json()) == entry
    # The two lookups above asked the API once: the answer is cached.
    assert [r.path for r in civitai.requests] == ["/api/v1/model-versions/101"]


def test_a_model_without_a_version_resolves_to_its_latest_published_version(source, civitai):
    for text in ("https://civitai.com/models/20", "civitai:models/20", "urn:air:sdxl:lora:civitai:20"):
        assert source.resolve(text).version.version_id == 202


@pytest.mark.parametrize(("version", "what"), [(301, "a checkpoint"), (302, "an embedding")])
def test_what_is_not_a_lora_is_refused_naming_what_it_is(source, version, what):
    with pytest.raises(NotALoraError, match=f"is {what}.*, not a LoRA") as caught:
        source.resolve(f"civitai:{version}")
    assert caught.value.status == 400


def test_nsfw_loras_are_refused_above_the_ceiling(civitai):
    strict = CivitaiSource(civitai.url, timeout_s=5)
    with pytest.raises(ContentPolicyError, match="marked NSFW") as caught:
        strict.resolve("civitai:303")
    assert caught.value.status == 403
    with pytest.raises(ContentPolicyError, match=r"rated PG/R.*up to PG-13 \(CIVITAI_MAX_NSFW_LEVEL\)"):
        strict.resolve("civitai:304")
    lenient = CivitaiSource(civitai.url, timeout_s=5, max_nsfw=NsfwLevel.R)
    assert lenient.resolve("civitai:303").version.version_id == 303
    assert lenient.resolve("civitai:304").version.version_id == 304
    strict.close()
    lenient.close()


# `nsfwLevel` in every JSON form it may come in: read as a number, or (unreadable) counted above the ceiling.
READABLE_XXX = (16, 16.0, "16", " 16 ", "16.0")
READABLE_PG = (1, 1.0, "1")
UNREADABLE = (MISSING, None, "", "sixteen", 16.5, -16, True, float("inf"), [16], {"level": 16})
LEVELS = (*READABLE_XXX, *READABLE_PG, *UNREADABLE)


@pytest.fixture(scope="module")
def levels() -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        for index, level in enumerate(LEVELS):
            started.add_lora(1300 + index, DATA, nsfw_level=level, downloads=100 - index)
        yield started


def _version_of(level: object) -> str:
    return f"civitai:{1300 + next(i for i, known in enumerate(LEVELS) if known is level)}"


def _sources(url: str) -> dict[NsfwLevel, CivitaiSource]:
    return {c: CivitaiSource(url, timeout_s=5, max_nsfw=c) for c in (NsfwLevel.PG13, NsfwLevel.X, NsfwLevel.XXX)}


@pytest.mark.parametrize("level", READABLE_XXX, ids=repr)
def test_an_nsfw_level_in_any_json_number_form_is_refused_above_the_ceiling(levels, level):
    sources = _sources(levels.url)
    try:
        with pytest.raises(ContentPolicyError, match=r"is rated XXX on Civitai; accepted here: .* up to PG-13"):
            sources[NsfwLevel.PG13].resolve(_version_of(level))
        assert sources[NsfwLevel.XXX].resolve(_version_of(level)).version.nsfw_level == 16
    finally:
        for source in sources.values():
            source.close()


@pytest.mark.parametrize("level", READABLE_PG, ids=repr)
def test_a_pg_level_in_any_json_number_form_is_served(levels, level):
    source = CivitaiSource(levels.url, timeout_s=5)
    try:
        assert source.resolve(_version_of(level)).version.nsfw_level == 1
    finally:
        source.close()


@pytest.mark.parametrize("level", UNREADABLE, ids=lambda v: "missing" if v is MISSING else repr(v))
def test_an_unreadable_nsfw_level_counts_as_above_every_ceiling_but_the_top(levels, level):
    sources = _sources(levels.url)
    try:
        for ceiling in (NsfwLevel.PG13, NsfwLevel.X):
            with pytest.raises(ContentPolicyError, match="has no NSFW rating that could be read") as caught:
                sources[ceiling].resolve(_version_of(level))
            assert caught.value.status == 403
        # CIVITAI_MAX_NSFW_LEVEL=XXX allows every level, so not knowing which one does not matter.
        assert sources[NsfwLevel.XXX].resolve(_version_of(level)).version.nsfw_level is None
    finally:
        for source in sources.values():
            source.close()


def test_the_listing_applies_the_ceiling_to_levels_in_any_form_and_leaves_unreadable_ones_out(levels):
    sdxl = civitai_base("SDXL 1.0")
    assert sdxl is not None
    sources = _sources(levels.url)
    try:
        assert {e.ref for e in sources[NsfwLevel.PG13].list_loras([sdxl])} == {_version_of(v) for v in READABLE_PG}
        assert {e.ref for e in sources[NsfwLevel.X].list_loras([sdxl])} == {_version_of(v) for v in READABLE_PG}
        assert {e.ref for e in sources[NsfwLevel.XXX].list_loras([sdxl])} == {_version_of(v) for v in LEVELS}
    finally:
        for source in sources.values():
            source.close()


def test_early_access_is_a_403_naming_why(source):
    with pytest.raises(RestrictedLoraError, match="early access until 2999-01-01") as caught:
        source.resolve("civitai:305")
    assert caught.value.status == 403


def test_several_files_give_the_primary_safetensors_and_pickles_are_never_chosen(source):
    assert source.resolve("civitai:306").file.name == "style.safetensors"
    assert source.resolve("civitai:307").file.name == "style.safetensors"


def test_a_version_is_a_pair_only_on_a_two_stage_base_else_the_single_lora_of_its_primary_file(source, tmp_path):
    sdxl = source.resolve("civitai:601")
    assert (sdxl.file.name, sdxl.pair) == (GRAIN[1], None)
    assert source.download(sdxl, tmp_path, max_bytes=2**20).read_bytes() == DATA
    for version in (602, 603):
        wan = source.resolve(f"civitai:{version}")
        assert (wan.file.name, wan.pair.name if wan.pair else None) == GRAIN, version


def test_a_version_with_only_pickles_or_no_primary_is_refused(civitai):
    pickle = {"id": 9, "name": "only.ckpt", "type": "Model", "metadata": {"format": "PickleTensor"},
              "hashes": {"SHA256": "0" * 64}, "downloadUrl": "x", "sizeKB": 1}  # fmt: skip
    document = civitai.add_lora(601, DATA)
    document["files"] = [pickle]
    two = [{**pickle, "name": n, "metadata": {"format": "SafeTensor"}} for n in ("a.safetensors", "b.safetensors")]
    civitai.add_lora(602, DATA)["files"] = two
    fresh = CivitaiSource(civitai.url, timeout_s=5)
    with pytest.raises(PickleOnlyError, match="never unpickled"):
        fresh.resolve("civitai:601")
    with pytest.raises(AmbiguousWeightsError, match=r"a\.safetensors, b\.safetensors"):
        fresh.resolve("civitai:602")
    fresh.close()


def test_unknown_versions_are_404s_and_a_dead_api_a_503(source, civitai):
    with pytest.raises(LoraNotFoundError) as caught:
        source.resolve("civitai:999999")
    assert caught.value.status == 404
    dead = CivitaiSource("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(CivitaiUnavailableError) as down:
        dead.resolve("civitai:101")
    assert down.value.status == 503
    dead.close()


# -- downloads ----------------------------------------------------------------------------------------------


def download(source: CivitaiSource, ref: str, folder: Path) -> Path:
    return source.download(source.resolve(ref), folder, max_bytes=2**20)


def test_a_download_follows_a_redirect_to_an_allowed_host_and_is_checked(source, civitai, tmp_path):
    path = download(source, "civitai:101", tmp_path)
    assert path == tmp_path / "style.safetensors" and path.read_bytes() == DATA
    hosts = [(r.path.split("/")[1], r.host.split(":")[0]) for r in civitai.requests]
    assert ("api", "127.0.0.1") in hosts and ("storage", civitai.storage_host) in hosts
    assert download(source, "civitai:406", tmp_path / "direct").read_bytes() == DATA


def test_a_redirect_outside_the_allowed_hosts_is_refused_and_not_followed(source, civitai, tmp_path):
    with pytest.raises(DownloadRefusedError, match=r"'files\.example\.invalid' is neither") as caught:
        download(source, "civitai:401", tmp_path)
    assert caught.value.status == 502
    assert not any(r.path.startswith("/storage") for r in civitai.requests)
    # Without the storage host in the allow-list, even Civitai's own redirect is refused.
    closed = CivitaiSource(civitai.url, timeout_s=5)
    with pytest.raises(DownloadRefusedError, match=f"host '{civitai.storage_host}'"):
        download(closed, "civitai:101", tmp_path)
    closed.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("version", "why"), [(402, "requires a login"), (403, "HTTP 401"), (404, "HTTP 403")])
def test_downloads_needing_a_login_or_early_access_are_403s_naming_why(source, tmp_path, version, why):
    with pytest.raises(RestrictedLoraError, match=why) as caught:
        download(source, f"civitai:{version}", tmp_path)
    assert caught.value.status == 403
    assert "CIVITAI_TOKEN" in str(caught.value)


def test_a_hash_mismatch_is_refused_and_nothing_is_kept(source, tmp_path):
    with pytest.raises(DownloadRefusedError, match=r"has SHA256 .* not the .* its API gave") as caught:
        download(source, "civitai:405", tmp_path)
    assert caught.value.status == 502
    assert list(tmp_path.iterdir()) == []


def test_more_bytes_than_announced_are_refused(source, civitai, tmp_path):
    document = civitai.add_lora(701, DATA + b"x" * 200_000, download="direct")
    document["files"][-1]["sizeKB"] = len(DATA) / 1024  # the API understates the size
    fresh = CivitaiSource(civitai.url, timeout_s=5)
    with pytest.raises(DownloadRefusedError, match=r"announced|more than"):
        download(fresh, "civitai:701", tmp_path)
    fresh.close()
    assert list(tmp_path.iterdir()) == []


def test_the_token_goes_to_the_api_host_only_and_is_never_shown(civitai, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    source = CivitaiSource(civitai.url, token=TOKEN, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    civitai.clear_requests()
    download(source, "civitai:101", tmp_path)
    failures = []
    for ref in ("civitai:401", "civitai:403", "civitai:405", "civitai:301", "civitai:999999"):
        with pytest.raises(Exception) as caught:
            download(source, ref, tmp_path / ref.replace(":", "-"))
        failures.append(caught.value)
    sent = civitai.requests
    api = [r for r in sent if r.host.startswith("127.0.0.1")]
    storage = [r for r in sent if not r.host.startswith("127.0.0.1")]
    assert api and storage
    assert all(r.authorization == f"Bearer {TOKEN}" for r in api)
    assert all(r.authorization is None for r in storage)
    assert all(TOKEN not in r.path and TOKEN not in str(r.query) for r in sent)
    for error in failures:
        assert TOKEN not in str(error) and TOKEN not in repr(error)
    assert TOKEN not in caplog.text
    source.close()


# -- cached like Hub metadata ---------------------------------------------------------------------------


def test_answers_are_served_stale_while_revalidated_and_dropped_when_gone(civitai):
    now = [0.0]
    civitai.add_lora(801, DATA)
    source = CivitaiSource(civitai.url, timeout_s=5, cache_ttl_s=60, clock=lambda: now[0])
    assert source.resolve("civitai:801").version.version_id == 801
    assert source.stale_warning("civitai:801") is None
    # Civitai down: the cached answer is served at once, and says how old it is and why.
    civitai.api_status = 503
    try:
        now[0] = 120.0
        assert source.resolve("civitai:801").version.version_id == 801
        assert source._versions.wait_idle(10)
        warning = source.stale_warning("civitai:801")
        assert warning is not None and "2 min old: Civitai could not be reached" in warning
        assert "HTTP 503" in warning
    finally:
        civitai.api_status = None
    # Back up, and the version unpublished: the next revalidation drops it, and then it is a 404.
    civitai.remove(801)
    now[0] = 300.0
    assert source.resolve("civitai:801").version.version_id == 801
    assert source._versions.wait_idle(10)
    with pytest.raises(LoraNotFoundError):
        source.resolve("civitai:801")
    source.close()


# -- the catalogue's Civitai tab -------------------------------------------------------------------------


def test_the_civitai_tab_lists_loras_for_a_base_most_downloaded_first_policy_applied(hub):
    from lora_catalog.catalog import Catalog
    from lora_catalog.hub import HubSource

    with StandInCivitai() as listing:
        listing.add_lora(901, DATA, model_id=91, downloads=5)
        listing.add_lora(902, DATA, model_id=92, downloads=50, base_model="Pony")
        listing.add_lora(903, DATA, model_id=93, downloads=500, base_model="SD 1.5")
        listing.add_lora(904, DATA, model_id=94, downloads=5000, nsfw=True)
        listing.add_lora(905, DATA, model_id=95, downloads=900, availability="EarlyAccess")
        listing.add_lora(906, DATA, model_id=96, downloads=20, model_type="Checkpoint")
        source = CivitaiSource(listing.url, timeout_s=5)
        catalog = Catalog(HubSource(endpoint=hub.url, timeout_s=5), civitai=source, refresh=False)
        try:
            sdxl = catalog.page("stabilityai/stable-diffusion-xl-base-1.0", source="civitai")
            assert [e.ref for e in sdxl.entries] == ["civitai:902", "civitai:901"]
            assert sdxl.entries[0].tags == ("civitai-base:Pony",) and sdxl.entries[0].source == "civitai"
            assert sdxl.freshness.source == "civitai" and "Live from Civitai (SDXL 1.0 + Pony" in sdxl.freshness.message
            query = next(r.query for r in listing.requests if r.path == "/api/v1/models")
            assert query["types"] == ["LORA"] and query["sort"] == ["Most Downloaded"] and query["nsfw"] == ["false"]
            assert set(query["baseModels"]) == {"SDXL 1.0", "Pony", "Illustrious", "NoobAI"}
            sd15 = catalog.page("stable-diffusion-v1-5/stable-diffusion-v1-5", source="civitai")
            assert [e.ref for e in sd15.entries] == ["civitai:903"]
            # Asked again within the TTL: from the cache.
            before = len(listing.requests)
            catalog.page("stabilityai/stable-diffusion-xl-base-1.0", source="civitai")
            assert len(listing.requests) == before
            other = catalog.page("stabilityai/stable-diffusion-2-1", source="civitai")
            assert other.entries == () and "no LoRAs this Space maps" in other.freshness.message
            with pytest.raises(InvalidRequestError, match="accepted: hub, civitai"):
                catalog.page("stabilityai/stable-diffusion-xl-base-1.0", source="elsewhere")  # type: ignore[arg-type]
        finally:
            catalog.close()
    # Civitai down, nothing cached: an empty page saying so, not an error.
    down = Catalog(None, civitai=CivitaiSource("http://127.0.0.1:9", timeout_s=2), refresh=False)
    page = down.page("stabilityai/stable-diffusion-xl-base-1.0", source="civitai")
    assert page.entries == () and page.freshness.offline and "Civitai could not be reached" in page.freshness.message
    down.close()


@contextmanager
def civitai_tab(hub_url: str, groups: dict[int, str]) -> Iterator[tuple[Any, StandInCivitai]]:
    """A catalogue over the stand-in Hub and a stand-in Civitai holding one LoRA version per `groups` item
    (version id -> Civitai's base label, downloads 5, its model the default): (catalog, Civitai), closed after."""
    from lora_catalog.catalog import Catalog
    from lora_catalog.hub import HubSource

    with StandInCivitai() as listing:
        for version, label in groups.items():
            listing.add_lora(version, DATA, downloads=5, base_model=label)
        source = CivitaiSource(listing.url, timeout_s=5)
        catalog = Catalog(HubSource(endpoint=hub_url, timeout_s=5), civitai=source, refresh=False)
        try:
            yield catalog, listing
        finally:
            catalog.close()


def asked_groups(listing: StandInCivitai) -> list[str]:
    """The Civitai base labels the tab's latest listing request asked for."""
    return [r.query for r in listing.requests if r.path == "/api/v1/models"][-1]["baseModels"]


def test_the_civitai_tab_lists_chromas_one_group_for_hd_and_base(hub):
    """Civitai's one "Chroma" group holds Chroma1-HD's and Chroma1-Base's LoRAs: both bases list it."""
    with civitai_tab(hub.url, {921: "Chroma", 922: "Flux.1 D"}) as (catalog, listing):
        for base in ("lodestones/Chroma1-HD", "lodestones/Chroma1-Base"):
            page = catalog.page(base, source="civitai")
            assert [e.ref for e in page.entries] == ["civitai:921"], base
            assert "Live from Civitai (Chroma" in page.freshness.message
            assert asked_groups(listing) == ["Chroma"]


@pytest.mark.parametrize("base", ["krea/Krea-2-Raw", "krea/Krea-2-Turbo"])
def test_the_civitai_tab_lists_krea2s_group_under_krea_2_raw_and_turbo(hub, base):
    """Civitai's "Krea 2" group (its LoRAs are trained on Raw) is listed under Krea 2 Raw, as Krea 2 LoRAs, and
    under Turbo, the pool they usually run on; a Qwen-Image one (whose diffusers names Krea 2's attention shares)
    is not."""
    with civitai_tab(hub.url, {931: "Krea 2", 932: "Qwen"}) as (catalog, listing):
        page = catalog.page(base, source="civitai")
        assert [(e.ref, e.family, e.source) for e in page.entries] == [("civitai:931", Family.KREA2, "civitai")]
        assert "Live from Civitai (Krea 2" in page.freshness.message
        assert asked_groups(listing) == ["Krea 2"]


def test_the_civitai_tab_lists_each_checkpoints_group_and_2512_the_one_qwen_group(hub):
    """FLUX.1 Krea [dev] and Z-Image base have Civitai groups of their own; Qwen-Image-2512 shares Qwen-Image's one
    "Qwen" group (a file's metadata tells them apart: tests/engine/families/test_checkpoints.py)."""
    groups = {911: "Flux.1 Krea", 912: "ZImageBase", 913: "Qwen", 914: "Flux.1 D"}
    with civitai_tab(hub.url, groups) as (catalog, listing):
        for base, label, ref in (
            ("black-forest-labs/FLUX.1-Krea-dev", "Flux.1 Krea", "civitai:911"),
            ("Tongyi-MAI/Z-Image", "ZImageBase", "civitai:912"),
            ("Qwen/Qwen-Image-2512", "Qwen", "civitai:913"),
        ):
            page = catalog.page(base, source="civitai")
            assert [e.ref for e in page.entries] == [ref]
            assert f"Live from Civitai ({label}" in page.freshness.message
            assert asked_groups(listing) == [label]
