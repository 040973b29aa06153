"""`VAE_ID` goes only to the pools whose latent space it fits (issue 20, defect 1).

Before the fix every pool loaded it, so an SDXL VAE (scaling factor 0.13025) decoded SD 1.5's latents (scaled
by 0.18215): a wrong image with a 200. The pools here are tiny folders loaded like real ones (`from_pretrained`);
the "SDXL" one's VAE config says 0.13025, as SDXL's does, and so does the override (like the fp16-fix VAE).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKL

from engine.errors import SettingsError
from engine.pipeline.loading import load_pipeline
from engine.pools.pools import build_pools
from engine.prepare.resolve import AdapterResolver
from engine.settings import PoolSetting
from tests.support.loras import SD15, SDXL

SDXL_SCALING = 0.13025


@pytest.fixture(scope="module")
def folders(tiny_dir: Path, tiny_sd15_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vae-override")
    sdxl = root / "sdxl"
    shutil.copytree(tiny_dir, sdxl)
    config = sdxl / "vae" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "scaling_factor": SDXL_SCALING}))
    # Another VAE of SDXL's latent space: other weights, the same config.
    override = AutoencoderKL.from_pretrained(sdxl / "vae")
    with torch.no_grad():
        for parameter in override.parameters():
            parameter.add_(0.01)
    override.save_pretrained(root / "fp16-fix")
    return {"sdxl": sdxl, "sd15": tiny_sd15_dir, "vae": root / "fp16-fix"}


def two_pools(base_settings, folders, vae: Path):
    return base_settings.replace(
        model_id=str(folders["sdxl"]),
        base_model_id=SDXL,
        pools=(PoolSetting(str(folders["sdxl"]), SDXL), PoolSetting(str(folders["sd15"]), SD15)),
        vae_id=str(vae),
    )


def vae_state(vae) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in vae.state_dict().items()}


def test_the_vae_override_goes_only_to_the_pool_it_fits(base_settings, folders):
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=base_settings.max_adapter_bytes)
    pools = build_pools(two_pools(base_settings, folders, folders["vae"]), resolver, load_pipeline, warm=False)
    try:
        sdxl, sd15 = (p.engine.loaded.pipe.vae for p in pools.pools)
        own_sd15 = AutoencoderKL.from_pretrained(folders["sd15"] / "vae")
        override = AutoencoderKL.from_pretrained(folders["vae"])
        assert sd15.config.scaling_factor == own_sd15.config.scaling_factor == 0.18215
        assert all(torch.equal(v, vae_state(own_sd15)[k]) for k, v in vae_state(sd15).items())
        assert sdxl.config.scaling_factor == SDXL_SCALING
        assert all(torch.equal(v, vae_state(override)[k]) for k, v in vae_state(sdxl).items())
    finally:
        pools.close()


def test_one_pool_with_a_vae_of_another_latent_space_is_refused_at_start(base_settings, folders):
    settings = base_settings.replace(model_id=str(folders["sd15"]), base_model_id=SD15, vae_id=str(folders["vae"]))
    with pytest.raises(SettingsError, match=r"VAE_ID=.* does not fit .*scaling_factor 0\.13025 where its own VAE has"):
        load_pipeline(settings, warm=False)


def test_a_vae_that_fits_no_pool_is_refused_at_start(base_settings, folders, tmp_path):
    odd = AutoencoderKL.from_pretrained(folders["vae"])
    odd.register_to_config(scaling_factor=0.5)
    odd.save_pretrained(tmp_path / "odd")
    resolver = AdapterResolver(None, local_dir=None, token=None, max_bytes=base_settings.max_adapter_bytes)
    with pytest.raises(SettingsError, match=r"VAE_ID fits none of the pools"):
        build_pools(two_pools(base_settings, folders, tmp_path / "odd"), resolver, load_pipeline, warm=False)
