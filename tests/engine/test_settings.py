"""Settings: built once from the environment, strictly."""

from __future__ import annotations

import pytest

from engine.errors import SettingsError
from engine.settings import DEFAULT_MODEL_ID, Settings, parse_bytes


def test_defaults_serve_sdxl_on_an_auto_device():
    settings = Settings.from_env({})
    assert settings.model_id == DEFAULT_MODEL_ID and settings.base_model_id == DEFAULT_MODEL_ID
    assert not settings.model_id_explicit
    assert (settings.device, settings.dtype, settings.gpu_mode) == ("auto", "auto", "auto")
    assert not settings.per_call
    assert (settings.server_name, settings.server_port) == ("0.0.0.0", 7860)


def test_a_hub_model_id_is_also_the_base_unless_a_base_is_named():
    assert Settings.from_env({"MODEL_ID": "someone/sdxl-finetune"}).base_model_id == "someone/sdxl-finetune"
    named = Settings.from_env({"MODEL_ID": "tiny", "BASE_MODEL_ID": "stabilityai/stable-diffusion-xl-base-1.0"})
    assert named.loads_tiny and named.model_id_explicit and named.base_model_id == DEFAULT_MODEL_ID


def test_a_local_folder_stands_in_for_the_default_base(tmp_path):
    settings = Settings.from_env({"MODEL_ID": str(tmp_path)})
    assert settings.model_id == str(tmp_path) and settings.base_model_id == DEFAULT_MODEL_ID


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEVICE": "gpu"}, r"DEVICE='gpu' is not accepted; accepted: auto, cpu, cuda, cuda:<index>, mps"),
        ({"DTYPE": "fp16"}, r"DTYPE='fp16' is not accepted; accepted: auto, float32, float16, bfloat16"),
        ({"GPU_MODE": "zero"}, r"GPU_MODE='zero' is not accepted; accepted: auto, persistent, per_call"),
        ({"HOST_CACHE_BYTES": "lots"}, r"HOST_CACHE_BYTES='lots' is not a byte size"),
        ({"PRISTINE_BYTES": "-1GiB"}, r"PRISTINE_BYTES='-1GiB' is not a byte size"),
        ({"DISK_CACHE_BYTES": "20 TB"}, r"DISK_CACHE_BYTES='20 TB' is not a byte size"),
        ({"MAX_LORAS": "0"}, r"MAX_LORAS='0' is not accepted; accepted: an integer from 1 to 8"),
        ({"MAX_STEPS": "ten"}, r"MAX_STEPS='ten' is not accepted"),
        ({"CATALOG_REFRESH": "maybe"}, r"CATALOG_REFRESH='maybe' is not accepted; accepted: 1, true"),
        ({"LOCAL_LORA_DIR": "/no/such/folder"}, r"LOCAL_LORA_DIR='/no/such/folder' is not an existing folder"),
        ({"BASE_MODEL_ID": "../etc"}, r"BASE_MODEL_ID='../etc' is not a Hub repo id"),
        ({"HUB_TIMEOUT_S": "-1"}, r"HUB_TIMEOUT_S='-1' is not accepted; accepted: a number from 0.1 to 600"),
        (
            {"GRADIO_SERVER_PORT": "http"},
            r"GRADIO_SERVER_PORT='http' is not accepted; accepted: an integer from 1 to 65535",
        ),
        ({"LOG_LEVEL": "LOUD"}, r"LOG_LEVEL='LOUD' is not accepted; accepted: DEBUG, INFO, WARNING, ERROR"),
        ({"AFFINITY_MAX_SKIP": "-1"}, r"AFFINITY_MAX_SKIP='-1' is not accepted; accepted: an integer from 0 to 1000"),
        ({"PREPARE_WORKERS": "0"}, r"PREPARE_WORKERS='0' is not accepted; accepted: an integer from 1 to 64"),
        ({"PREPARE_INFLIGHT_BYTES": "0"}, r"PREPARE_INFLIGHT_BYTES='0' is not accepted; accepted: a byte size of at"),
        ({"PREPARE_INFLIGHT_BYTES": "much"}, r"PREPARE_INFLIGHT_BYTES='much' is not a byte size"),
        ({"SCHEDULER": "fifo"}, r"SCHEDULER='fifo' is not accepted; accepted: affinity, fifo_inline"),
        ({"METRICS": "please"}, r"METRICS='please' is not accepted; accepted: 1, true"),
        ({"QUANTIZE": "int8"}, r"QUANTIZE='int8' is not accepted; accepted: off, fp8, int4, auto"),
        ({"INT4_GROUP_SIZE": "100"}, r"INT4_GROUP_SIZE='100' is not accepted; accepted: 32, 64, 128"),
        ({"LORA_MAX_RANK": "0"}, r"LORA_MAX_RANK='0' is not accepted; accepted: an integer from 1 to 1024"),
        ({"LORA_MAX_RANK": "4096"}, r"LORA_MAX_RANK='4096' is not accepted; accepted: an integer from 1 to 1024"),
    ],
)
def test_a_bad_value_names_itself_and_what_is_accepted(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_the_scheduler_settings_default_to_affinity_under_a_small_bound():
    settings = Settings.from_env({})
    assert (settings.scheduler, settings.affinity_max_skip, settings.prepare_workers) == ("affinity", 3, 2)
    assert settings.prepare_inflight_bytes == 2 * 2**30
    strict = Settings.from_env({"AFFINITY_MAX_SKIP": "0", "SCHEDULER": "fifo_inline", "PREPARE_INFLIGHT_BYTES": "1GB"})
    assert (strict.affinity_max_skip, strict.scheduler, strict.prepare_inflight_bytes) == (0, "fifo_inline", 10**9)


def test_quantize_defaults_to_auto_and_branches_to_rank_128():
    settings = Settings.from_env({})
    assert (settings.quantize, settings.lora_max_rank) == ("auto", 128)
    chosen = Settings.from_env({"QUANTIZE": " FP8 ", "LORA_MAX_RANK": "64"})
    assert (chosen.quantize, chosen.lora_max_rank) == ("fp8", 64)
    assert Settings.from_env({"QUANTIZE": "off"}).quantize == "off"


def test_metrics_are_off_unless_turned_on():
    assert not Settings.from_env({}).metrics
    assert Settings.from_env({"METRICS": "1"}).metrics
    assert not Settings.from_env({"METRICS": "0"}).metrics


def test_zero_gpu_means_per_call_unless_forced():
    assert Settings.from_env({"SPACES_ZERO_GPU": "true"}).per_call
    assert not Settings.from_env({"SPACES_ZERO_GPU": "true", "GPU_MODE": "persistent"}).per_call
    assert Settings.from_env({"GPU_MODE": "per_call"}).per_call


def test_byte_sizes_take_units():
    assert parse_bytes("X", "4GiB") == 4 * 2**30
    assert parse_bytes("X", "512 MB") == 512 * 10**6
    assert parse_bytes("X", "1.5KiB") == 1536
    assert parse_bytes("X", "1048576") == 2**20


def test_the_token_never_shows_in_repr():
    settings = Settings.from_env({"HF_TOKEN": "hf_verysecret"})
    assert settings.hf_token == "hf_verysecret"
    assert "hf_verysecret" not in repr(settings)


def test_resource_budgets_parse_with_units():
    settings = Settings.from_env({"PRISTINE_BYTES": "512MiB", "DISK_CACHE_BYTES": "5GB"})
    assert (settings.pristine_bytes, settings.disk_cache_bytes) == (512 * 2**20, 5 * 10**9)
    defaults = Settings.from_env({})
    # PRISTINE_BYTES unset or `auto`: each pool's touchable weights (None here, the engine sizes it).
    assert (defaults.pristine_bytes, defaults.disk_cache_bytes) == (None, 20 * 2**30)
    assert Settings.from_env({"PRISTINE_BYTES": "auto"}).pristine_bytes is None


def test_civitai_settings_are_read_strictly_and_the_token_is_never_shown(tmp_path):
    default = Settings.from_env({})
    assert default.civitai and default.civitai_endpoint == "https://civitai.com"
    assert default.civitai_max_nsfw_level == "PG13" and default.civitai_token is None
    assert "*.civitai.com" in default.civitai_allowed_hosts
    settings = Settings.from_env(
        {
            "CIVITAI_ENDPOINT": "http://127.0.0.1:8000/",
            "CIVITAI_TOKEN": "civitai-token-value",
            "CIVITAI_MAX_NSFW_LEVEL": "pg-13",
            "CIVITAI_ALLOWED_HOSTS": "Files.Example.org, *.cdn.example.net",
            "CIVITAI_CACHE_DIR": str(tmp_path),
            "CIVITAI": "off",
        }
    )
    assert settings.civitai_endpoint == "http://127.0.0.1:8000" and settings.civitai_max_nsfw_level == "PG13"
    assert settings.civitai_allowed_hosts == ("files.example.org", "*.cdn.example.net")
    assert settings.civitai_cache_dir == tmp_path and not settings.civitai
    assert "civitai-token-value" not in repr(settings) and "civitai-token-value" not in str(settings)
    for env, message in (
        ({"CIVITAI_MAX_NSFW_LEVEL": "adult"}, r"CIVITAI_MAX_NSFW_LEVEL='adult' is not accepted; accepted: PG, PG13"),
        ({"CIVITAI_ALLOWED_HOSTS": "evil.com/x"}, r"holds 'evil.com/x', not a host name"),
        ({"CIVITAI_ENDPOINT": "civitai.com"}, r"CIVITAI_ENDPOINT='civitai.com' is not accepted; accepted: an http"),
    ):
        with pytest.raises(SettingsError, match=message):
            Settings.from_env(env)
