"""Wan 2.2 A14B pairs from the Hub and Civitai: a repo holding a high-noise and a low-noise file (alone, or a pair
named by its folder, Wan2.2-Lightning's layout, or by its two files joined with '+'), and a Civitai version whose
files are both halves, are each one LoRA, each file on its transformer: byte-identical to the same pair from a
local folder (which equals diffusers loading each file into its transformer: test_wan22_pairs). A folder of two
highs, a folder with one half, and halves of different bases are 400s, both transformers bit-exact after.
lightx2v's Wan2.2-Lightning pair from its repo brings its 4 steps and no CFG on both stages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save

from engine.errors import IncompatibleLoraError, InvalidRequestError
from engine.pools.engine import Engine
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.civitai.source import CivitaiSource
from lora_catalog.hub import HubSource
from serving.cluster.replica import lease_keys
from serving.recipes import parse_recipe, recipe_text
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, pixels
from tests.support.standin_civitai import StandInCivitai
from tests.support.wan import CASES, PROMPT, write_wan_loras

HIGH, LOW = "style_high_noise.safetensors", "style_low_noise.safetensors"
# lightx2v/Wan2.2-Lightning's layout: a folder per release, each holding the two halves by these names.
V11, V10 = "Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1/", "Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1/"
LIGHTNING = ("high_noise_model.safetensors", "low_noise_model.safetensors")
REPOS = ("wanhub/lightning-layout", "wanhub/one-pair", "wanhub/bad-pairs")
CIVITAI_PAIR = 4201
# The speed LoRA's own repo (lora_catalog.hints knows it): its pairs bring 4 steps and no CFG on both stages.
SPEED_REPO = "lightx2v/Wan2.2-Lightning"


def request(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 3, "width": 64, "height": 64, "seed": 7, "num_frames": 5} | fields
    return GenerateRequest(loras=tuple(loras), **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def halves(loaded_wan22, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The two halves' bytes (and with metadata naming different bases), and a local folder `pair/` of them."""
    folder = tmp_path_factory.mktemp("wan22-hub-pairs")
    write_wan_loras(loaded_wan22.pipe, folder, CASES[:2])
    high, low = (load_file(folder / case.file_name) for case in CASES[:2])
    made = {
        "high": save(high),
        "low": save(low),
        "high_a14b": save(high, metadata={"modelspec.architecture": "wan2.2-t2v-a14b"}),
        "low_13b": save(low, metadata={"modelspec.architecture": "wan2.1-t2v-1.3b"}),
    }
    (folder / "pair").mkdir()
    (folder / "pair" / HIGH).write_bytes(made["high"])
    (folder / "pair" / LOW).write_bytes(made["low"])
    return made | {"folder": str(folder).encode()}


@pytest.fixture(scope="module")
def published(hub, halves) -> None:
    high, low = halves["high"], halves["low"]
    hub.add_repo(
        REPOS[0],
        {V11 + LIGHTNING[0]: high, V11 + LIGHTNING[1]: low, V10 + LIGHTNING[0]: low, V10 + LIGHTNING[1]: high},
    )
    hub.add_repo(REPOS[1], {HIGH: high, LOW: low})
    hub.add_repo(SPEED_REPO, {V11 + LIGHTNING[0]: high, V11 + LIGHTNING[1]: low})
    bad = {"twice/" + HIGH: high, "twice/style_HIGH_NOISE.safetensors": low, "one/" + HIGH: high}
    hub.add_repo(REPOS[2], bad | {"bases/" + HIGH: halves["high_a14b"], "bases/" + LOW: halves["low_13b"]})


@pytest.fixture(scope="module")
def civitai(halves) -> Iterator[StandInCivitai]:
    with StandInCivitai() as started:
        # Civitai's one primary file is the high half; the low one is the version's other model file.
        started.add_lora(
            CIVITAI_PAIR, halves["high"], name=HIGH, base_model="Wan Video 2.2 T2V-A14B", more={LOW: halves["low"]}
        )
        yield started


@contextmanager
def hub_engine(loaded, settings, hub, civitai, folder: Path, cache: Path) -> Iterator[Engine]:
    from engine.prepare.civitai import CivitaiFiles

    source = CivitaiSource(civitai.url, timeout_s=5, allowed_hosts=(civitai.storage_host,))
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5),
        local_dir=folder,
        token=None,
        max_bytes=settings.max_adapter_bytes,
        cache_dir=cache / "hub",
        civitai=CivitaiFiles(source, cache / "civitai", max_bytes=settings.max_adapter_bytes),
    )
    engine = Engine(loaded, settings.replace(local_lora_dir=folder, base_model_id=loaded.base_model_id), resolver)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine(loaded_wan22, base_settings, hub, civitai, halves, published, tmp_path) -> Iterator[Engine]:
    folder = Path(halves["folder"].decode())
    with hub_engine(loaded_wan22, base_settings, hub, civitai, folder, tmp_path) as made:
        yield made


def same_frames(ours, theirs) -> bool:
    return all((pixels(a) == pixels(b)).all() for a, b in zip(ours, theirs, strict=True))


def test_a_pair_from_the_hub_or_civitai_is_the_local_folders_pair(engine):
    local = generate(engine, request(LoraSpec("local:pair", scale=0.8)))
    named = {
        "the repo's only pair": LoraSpec(REPOS[1], scale=0.8),
        "a folder": LoraSpec(REPOS[0], scale=0.8, weight_name=V11),
        "two files": LoraSpec(REPOS[0], scale=0.8, weight_name=f"{V11}{LIGHTNING[1]}+{V11}{LIGHTNING[0]}"),
        "a Civitai version": LoraSpec(f"civitai:{CIVITAI_PAIR}", scale=0.8),
    }
    for what, spec in named.items():
        result = generate(engine, request(spec))
        assert same_frames(result.frames, local.frames), what
    folder = generate(engine, request(LoraSpec(REPOS[0], scale=0.8, weight_name=V11)))
    assert folder.adapters[0].files == f"high: {V11}{LIGHTNING[0]}, low: {V11}{LIGHTNING[1]}"
    # A replica pins a pair by the key the engine prepared it under (its result's weight name is that key's).
    with engine.prepare(request(LoraSpec(REPOS[0], scale=0.8, weight_name=V11))) as prepared:
        assert lease_keys(folder) == tuple(adapter.key for adapter, *_ in prepared.adapters)
    # The recipe gives the pair back as a request names it: the same video again.
    again = parse_recipe(recipe_text(folder)).request.loras
    assert again == (LoraSpec(REPOS[0], 0.8, weight_name=f"{V11}{LIGHTNING[0]}+{V11}{LIGHTNING[1]}"),)
    # The other folder's pair is the halves swapped: its files' names, not their order, say which is which.
    swapped = generate(engine, request(LoraSpec(REPOS[0], scale=0.8, weight_name=V10)))
    assert not same_frames(swapped.frames, local.frames)


def test_each_half_from_the_hub_goes_to_its_own_transformer(engine):
    pair = generate(engine, request(LoraSpec(REPOS[1], scale=0.8)))
    for half in (HIGH, LOW):
        alone = generate(engine, request(LoraSpec(REPOS[1], scale=0.8, weight_name=half)))
        assert np.abs(pixels(alone.frames[-1]) - pixels(pair.frames[-1])).mean() > 0.5, half


def test_bad_hub_pairs_are_400s_and_both_transformers_stay_bit_exact(engine, loaded_wan22, pristine_wan22):
    generate(engine, request(LoraSpec(REPOS[1], scale=0.7, scale_2=0.4), steps=1))
    refusals = {
        "twice/": (InvalidRequestError, r"not one high-noise and one low-noise .*style_HIGH_NOISE.safetensors: high"),
        "one/": (InvalidRequestError, r"folder 'one/' .* holds 1 .safetensors files; accepted: a folder of two"),
        "bases/": (IncompatibleLoraError, r"its halves are of different bases"),
    }
    for folder, (error, message) in refusals.items():
        with pytest.raises(error, match=message) as caught:
            generate(engine, request(LoraSpec(REPOS[2], weight_name=folder), steps=1))
        assert caught.value.status == 400, folder
    engine.restore_base_weights()
    assert_components_pristine(loaded_wan22.pipe, pristine_wan22, ("transformer", "transformer_2", "text_encoder"))


def test_a_wan22_lightning_pair_from_the_hub_brings_4_steps_and_no_cfg_on_both_stages(engine):
    spec = LoraSpec(SPEED_REPO, weight_name=V11)
    offered = generate(engine, request(spec, steps=None))
    assert (offered.request.steps, offered.request.guidance, offered.request.guidance_2) == (4, 1.0, 1.0)
    said = f"speed LoRA (Wan2.2-Lightning, {SPEED_REPO})"
    assert dict(offered.request.defaults_from) == dict.fromkeys(("steps", "guidance", "guidance_2"), said)
    assert "CFG scale 2: 1" in recipe_text(offered)
    given = generate(engine, request(spec, steps=4, guidance=1.0, guidance_2=1.0))
    assert same_frames(offered.frames, given.frames)
