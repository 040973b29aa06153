"""Bad LoRA files and repos: each is refused with a specific error, and the engine serves what it served before.

The shared helpers here (`small`, `unchanged`) are used by the other reliability test modules too.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from engine.errors import (
    AdapterLoadError,
    LimitExceededError,
    LoraNotFoundError,
    SwitchboardError,
)
from engine.requests import LoraSpec
from tests.support.checks import BAD_REPOS, generate, prime, small, unchanged

# (spec overrides) -> fragment; the repo is fixtures["peft"] unless `ref` is given.
MISSING: list[tuple[dict[str, str], str]] = [
    ({"ref": "fixtures/does-not-exist"}, r"'fixtures/does-not-exist' was not found on the Hub"),
    ({"revision": "no-such-branch"}, r"revision 'no-such-branch' of LoRA repo 'fixtures/peft' was not found"),
    ({"revision": "0" * 40}, r"revision '0{40}' of LoRA repo 'fixtures/peft' was not found"),
    ({"weight_name": "missing.safetensors"}, r"file 'missing\.safetensors' was not found in LoRA repo"),
]


@pytest.fixture
def primed(make_engine, fixtures):
    return prime(make_engine, fixtures)


@pytest.mark.parametrize("role", sorted(BAD_REPOS))
def test_a_bad_lora_repo_is_refused_and_the_served_lora_stays(primed, fixtures, role):
    engine, good, image = primed
    error, fragment = BAD_REPOS[role]
    before = engine.status().applied
    with pytest.raises(error, match=fragment):
        generate(engine, small(good, LoraSpec(fixtures[role], scale=0.5), seed=6))
    assert engine.status().applied == before
    with pytest.raises(error, match=fragment):
        engine.check_lora(LoraSpec(fixtures[role]))
    assert generate(engine, small(good)).image.tobytes() == image


def test_every_bad_lora_leaves_the_base_bit_exact(engine, fixtures, loaded, pristine):
    base = generate(engine, small()).image.tobytes()
    for role, (error, fragment) in BAD_REPOS.items():
        with unchanged(engine, loaded, pristine), pytest.raises(error, match=fragment):
            generate(engine, small(LoraSpec(fixtures[role])))
    assert engine.status().cached == ()
    assert generate(engine, small()).image.tobytes() == base


@pytest.mark.parametrize(("overrides", "fragment"), MISSING)
def test_a_missing_repo_revision_or_file_is_unknown(engine, fixtures, loaded, pristine, overrides, fragment):
    spec = LoraSpec(**{"ref": fixtures["peft"], **overrides})
    with unchanged(engine, loaded, pristine), pytest.raises(LoraNotFoundError, match=fragment):
        generate(engine, small(spec))


def test_pickle_only_repos_are_never_downloaded_or_unpickled(engine, fixtures, hub, monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail("a pickle was loaded")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, refuse)
    hub.clear_requests()
    for role in ("pickle-only", "ckpt-only"):
        with pytest.raises(AdapterLoadError, match="never unpickled"):
            generate(engine, small(LoraSpec(fixtures[role])))
        with pytest.raises(AdapterLoadError, match="never unpickled"):
            engine.check_lora(LoraSpec(fixtures[role]))
    # Naming the pickle outright is refused before any Hub call.
    with pytest.raises(SwitchboardError, match=r"weight_name 'pytorch_lora_weights\.bin' is a pickle file"):
        generate(engine, small(LoraSpec(fixtures["pickle-only"], weight_name="pytorch_lora_weights.bin")))
    fetched = [r.path for r in hub.requests if "/resolve/" in r.path]
    assert not [p for p in fetched if p.endswith((".bin", ".ckpt", ".pt"))]


def test_a_file_over_the_size_limit_is_refused_before_download(make_engine, fixtures, hub, loaded, pristine):
    engine = make_engine(max_adapter_bytes=50_000)
    hub.clear_requests()
    fragment = (
        r"'fixtures/oversize' \(pytorch_lora_weights\.safetensors\) is 0\.\d+ MiB; "
        r"accepted: files up to 0\.05 MiB"
    )
    with unchanged(engine, loaded, pristine), pytest.raises(LimitExceededError, match=fragment):
        generate(engine, small(LoraSpec(fixtures["oversize"])))
    asked = [(r.method, r.path) for r in hub.requests]
    assert asked, "the size comes from the Hub's metadata"
    assert not [a for a in asked if "/resolve/" in a[1]], f"the file was fetched: {asked}"


def test_one_of_several_candidate_files_can_be_named(engine, fixtures):
    spec = LoraSpec(fixtures["several"], weight_name="a.safetensors")
    assert generate(engine, small(spec)).adapters[0].weight_name == "a.safetensors"
    with pytest.raises(AdapterLoadError, match=r"is not a valid safetensors file: b\.safetensors: "):
        generate(engine, small(LoraSpec(fixtures["several"], weight_name="b.safetensors")))


def test_a_lora_without_a_card_base_is_accepted_with_a_warning(engine, fixtures):
    check = engine.check_lora(LoraSpec(fixtures["no-base"]))
    assert any("declares no base model" in w for w in check.warnings), check.warnings
    result = generate(engine, small(LoraSpec(fixtures["no-base"])))
    assert result.image.size == (64, 64)


def test_error_messages_do_not_reveal_server_paths(engine, fixtures):
    cache = str(Path(constants.HF_HUB_CACHE).parent)
    for role in ("truncated", "lying-header", "huge-header", "lying-shape"):
        with pytest.raises(AdapterLoadError) as raised:
            generate(engine, small(LoraSpec(fixtures[role])))
        message = str(raised.value)
        assert cache not in message and "snapshots" not in message, message
