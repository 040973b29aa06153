"""MODELS items naming a GGUF denoiser (`MODEL[=BASE]@GGUF`): one syntax, parsed strictly; anything else refused
at start-up showing the accepted form (engine.weights.gguf refuses a local path outside GGUF_DIR, at load)."""

from __future__ import annotations

import pytest

from engine.errors import SettingsError
from engine.settings import PoolSetting, Settings, parse_models

FLUX = "black-forest-labs/FLUX.1-dev"
HUB_FILE = "city96/FLUX.1-dev-gguf/flux1-dev-Q4_K_S.gguf"


def test_a_models_item_names_its_gguf_denoiser_on_the_hub_or_locally(tmp_path):
    pools = parse_models(f"{FLUX}@{HUB_FILE}, someone/tune={FLUX}@/models/tune-Q8_0.gguf,tiny-flux@/g/t.gguf")
    assert pools == (
        PoolSetting(FLUX, FLUX, None, HUB_FILE),
        PoolSetting("someone/tune", FLUX, None, "/models/tune-Q8_0.gguf"),
        PoolSetting("tiny-flux", FLUX, None, "/g/t.gguf"),
    )
    settings = Settings.from_env({"MODELS": f"{FLUX}@{HUB_FILE},tiny", "GGUF_DIR": str(tmp_path)})
    assert settings.gguf_dir == tmp_path
    # The first pool's, as its model and base: one pool loads from the whole settings.
    assert (settings.model_id, settings.gguf) == (FLUX, HUB_FILE)
    assert settings.for_pool(settings.pools[0]).gguf == HUB_FILE
    assert settings.for_pool(settings.pools[1]).gguf is None


@pytest.mark.parametrize(
    "item",
    [
        f"{FLUX}@{HUB_FILE}:fp8",  # the file fixes the storage
        f"{FLUX}@{HUB_FILE}:off",
        f"{FLUX}@city96/FLUX.1-dev-gguf",  # no file in the repo
        f"{FLUX}@flux1-dev-Q4_K_S.gguf",  # a relative path
        f"{FLUX}@./flux1-dev-Q4_K_S.gguf",
        f"{FLUX}@city96/FLUX.1-dev-gguf/flux1-dev.safetensors",  # not a .gguf
        f"{FLUX}@",
        f"{FLUX}@a@b.gguf",
        f"{FLUX}@bad owner/repo/x.gguf",
    ],
)
def test_any_other_gguf_form_is_refused_showing_the_accepted_one(item):
    with pytest.raises(SettingsError, match=r"is not accepted; accepted: MODEL\[=BASE\]@GGUF .*OWNER/REPO/PATH\.gguf"):
        parse_models(item)


def test_a_two_transformer_base_names_its_second_gguf_file_after_its_first():
    wan = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
    high, low = "QuantStack/Wan2.2-T2V-A14B-GGUF/HighNoise/high-Q4_K_M.gguf", "/g/low-Q4_K_M.gguf"
    (pool,) = parse_models(f"{wan}@{high}@{low}")
    assert pool == PoolSetting(wan, wan, None, high, low)
    settings = Settings.from_env({"MODELS": f"{wan}@{high}@{low}"})
    assert (settings.gguf, settings.gguf_2) == (high, low)
    assert settings.for_pool(pool).gguf_2 == low
    # A third file, or a second one not of the form, is refused showing the two-file form.
    for item in (f"{wan}@{high}@{low}@{low}", f"{wan}@{high}@low.safetensors", f"{wan}@{high}@"):
        with pytest.raises(SettingsError, match=r"accepted: MODEL\[=BASE\]@GGUF .*MODEL\[=BASE\]@GGUF@GGUF_2"):
            parse_models(item)
