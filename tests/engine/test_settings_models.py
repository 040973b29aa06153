"""MODELS and POOL_OFFLOAD: strict parsing, the MODEL_ID shorthand, and the start-up plan's default pools."""

from __future__ import annotations

import pytest

from engine.errors import SettingsError
from engine.settings import DEFAULT_MODEL_ID, TINY_MODEL_ID, PoolSetting, Settings, parse_models
from families import IDENTITIES
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from serving.runtime import DEFAULT_POOLS, DEMO_POOLS, plan_start

SD21 = "stabilityai/stable-diffusion-2-1"


def test_models_lists_pools_the_first_being_the_default(tmp_path):
    settings = Settings.from_env(
        {"MODELS": f" {DEFAULT_MODEL_ID} , someone/sd15-tune={SD15_MODEL_ID},{tmp_path}={SD21}"}
    )
    assert settings.pool_settings == (
        PoolSetting(DEFAULT_MODEL_ID, DEFAULT_MODEL_ID),
        PoolSetting("someone/sd15-tune", SD15_MODEL_ID),
        PoolSetting(str(tmp_path), SD21),
    )
    assert (settings.model_id, settings.base_model_id) == (DEFAULT_MODEL_ID, DEFAULT_MODEL_ID)
    assert settings.model_id_explicit is True
    assert settings.for_pool(settings.pools[1]).base_model_id == SD15_MODEL_ID


def test_tiny_models_default_to_their_own_base():
    assert parse_models("tiny,tiny-sd15,tiny-flux") == DEMO_POOLS
    assert Settings.from_env({"MODELS": "tiny,tiny-sd15"}).loads_tiny


def test_flux_bases_and_their_fine_tunes_are_served():
    pools = parse_models("black-forest-labs/FLUX.1-schnell,someone/flux-tune=black-forest-labs/FLUX.1-dev,tiny-flux")
    assert [p.base_model_id for p in pools] == [
        "black-forest-labs/FLUX.1-schnell",
        "black-forest-labs/FLUX.1-dev",
        "black-forest-labs/FLUX.1-dev",
    ]


def test_a_models_item_may_name_its_own_quantize():
    models = f"black-forest-labs/FLUX.1-dev : FP8, someone/xl-tune={DEFAULT_MODEL_ID}:off"
    settings = Settings.from_env({"MODELS": models})
    flux, sdxl = settings.pool_settings
    assert (flux.model_id, flux.quantize) == ("black-forest-labs/FLUX.1-dev", "fp8")
    assert (sdxl.model_id, sdxl.base_model_id, sdxl.quantize) == ("someone/xl-tune", DEFAULT_MODEL_ID, "off")
    # A pool's own settings carry its QUANTIZE; a pool that names none, the QUANTIZE setting's.
    assert settings.for_pool(flux).quantize == "fp8" and settings.for_pool(sdxl).quantize == "off"
    assert settings.for_pool(parse_models("tiny")[0]).quantize == settings.quantize == "auto"
    assert parse_models(f"{DEFAULT_MODEL_ID}:int4")[0].quantize == "int4"
    with pytest.raises(SettingsError, match=r"QUANTIZE 'int8' is not accepted; accepted: off, fp8, int4, auto"):
        parse_models(f"{DEFAULT_MODEL_ID}:int8")


def test_two_pools_of_one_family_are_allowed():
    pools = parse_models(f"{DEFAULT_MODEL_ID},someone/xl-tune={DEFAULT_MODEL_ID}")
    assert [p.base_model_id for p in pools] == [DEFAULT_MODEL_ID, DEFAULT_MODEL_ID]


def test_model_id_stays_the_one_pool_shorthand():
    settings = Settings.from_env({"MODEL_ID": "tiny-sd15"})
    assert settings.pool_settings == (PoolSetting("tiny-sd15", SD15_MODEL_ID),)
    assert Settings.from_env({}).pool_settings == (PoolSetting(DEFAULT_MODEL_ID, DEFAULT_MODEL_ID),)
    assert Settings.from_env({}).pool_offload is True
    assert Settings.from_env({"POOL_OFFLOAD": "off"}).pool_offload is False


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("tiny,", r"MODELS='tiny,' has an empty item; accepted: a comma-separated list of MODEL or MODEL=BASE"),
        (",", r"MODELS=',' names no model"),
        ("  ", r"names no model"),
        (f"{DEFAULT_MODEL_ID},,{SD15_MODEL_ID}", r"has an empty item"),
        ("a/b=", r"item 'a/b=' is malformed; accepted: a comma-separated list"),
        ("=a/b", r"item '=a/b' is malformed"),
        ("a/b=c/d=e/f", r"is malformed"),
        ("a/b=not a repo", r"BASE 'not a repo' is not a Hub repo id"),
        ("someone/xl-tune=stabilityai/stable-diffusion-xl-refiner-1.0", r"refiner-1.0' is not a base we know"),
        ("someone/thing", r"base 'someone/thing' is not a base we know.*names the base it was trained from"),
        (f"{DEFAULT_MODEL_ID},{DEFAULT_MODEL_ID}", r"lists 'stabilityai/stable-diffusion-xl-base-1.0' twice"),
    ],
)
def test_a_bad_models_list_fails_naming_the_accepted_form(raw, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({"MODELS": raw})


def test_a_local_folder_needs_its_base(tmp_path):
    with pytest.raises(SettingsError, match=r"is a local folder without a BASE; accepted: "):
        parse_models(str(tmp_path))


def test_models_and_model_id_together_are_refused():
    with pytest.raises(SettingsError, match=r"MODELS and MODEL_ID are both set; accepted: MODELS alone"):
        Settings.from_env({"MODELS": "tiny", "MODEL_ID": "tiny"})
    with pytest.raises(SettingsError, match=r"MODELS and BASE_MODEL_ID are both set"):
        Settings.from_env({"MODELS": "tiny", "BASE_MODEL_ID": DEFAULT_MODEL_ID})


def test_pool_offload_is_parsed_strictly():
    with pytest.raises(SettingsError, match=r"POOL_OFFLOAD='sometimes' is not accepted; accepted: 1, true"):
        Settings.from_env({"POOL_OFFLOAD": "sometimes"})


def test_default_pools_follow_the_gpu_memory():
    settings = Settings.from_env({})
    big = plan_start(settings, cuda=lambda: True, probe=lambda s: None, device_bytes=lambda: 24 * 10**9)
    small = plan_start(settings, cuda=lambda: True, probe=lambda s: None, device_bytes=lambda: 16 * 10**9)
    assert big.settings.pool_settings == DEFAULT_POOLS
    assert small.settings.pool_settings == (PoolSetting(DEFAULT_MODEL_ID, DEFAULT_MODEL_ID),)
    demo = plan_start(settings, cuda=lambda: False, probe=lambda s: None)
    assert demo.demo and demo.settings.pool_settings == DEMO_POOLS
    explicit = plan_start(Settings.from_env({"MODELS": "tiny,tiny-sd15"}), cuda=lambda: True, probe=lambda s: None)
    assert explicit.demo and explicit.reason == "MODELS=tiny,tiny-sd15 is set"


def test_the_deployment_follows_the_identities_declarations():
    # The first registered family is the default: the offline demo's first pool and the default pools' first.
    first = next(iter(IDENTITIES.values()))
    assert (first.model_id, first.tiny_id) == (DEFAULT_MODEL_ID, TINY_MODEL_ID) and first.demo and first.default_pool
    demo = [i for i in IDENTITIES.values() if i.demo]
    assert all(i.tiny_id for i in demo)
    assert [(p.model_id, p.base_model_id) for p in DEMO_POOLS] == [(i.tiny_id, i.model_id) for i in demo]
    assert [p.model_id for p in DEFAULT_POOLS] == [i.model_id for i in IDENTITIES.values() if i.default_pool]
