"""An SDXL pool in half precision keeps its VAE in float32 from load on, and never upcasts it per request
(issue 29 §4.2): diffusers' per-decode `upcast_vae` warns (an error under the tests' warning filter) and re-points
the VAE's parameters twice a request, out of the pool's flat buffer."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from engine.families.sdxl import build_tiny_pipeline
from engine.pipeline.loading import load_pipeline
from engine.pools.flat import module_tensors

RUN = {"prompt": "a red fox", "num_inference_steps": 2, "width": 32, "height": 32, "output_type": "np"}


def _image(pipe) -> np.ndarray:
    return pipe(**RUN, generator=torch.Generator("cpu").manual_seed(0)).images[0]


@pytest.fixture(scope="module")
def half(base_settings):
    return load_pipeline(base_settings.replace(dtype="float16"), warm=False)


def test_a_half_precision_sdxl_pool_decodes_without_upcasting_its_vae(half, monkeypatch):
    def refuse(self) -> None:
        raise AssertionError("upcast_vae called during a request")

    monkeypatch.setattr(type(half.pipe), "upcast_vae", refuse)
    assert half.pipe.unet.dtype == torch.float16
    assert half.pipe.vae.dtype == torch.float32
    pointers = [t.data_ptr() for t in module_tensors([half.pipe.vae])]
    image = _image(half.pipe)
    assert np.isfinite(image).all()
    # Nothing was re-pointed: the VAE's tensors are where the pool's flat buffer put them.
    assert [t.data_ptr() for t in module_tensors([half.pipe.vae])] == pointers
    assert half.pipe.vae.dtype == torch.float32


def test_its_image_is_diffusers_own_upcast_decode(half):
    reference = build_tiny_pipeline().to(dtype=torch.float16)
    assert reference.vae.config.force_upcast
    with warnings.catch_warnings():
        # diffusers' own path, deprecated: the reference this pool's decode must match.
        warnings.filterwarnings("ignore", "`upcast_vae` is deprecated", FutureWarning)
        expected = _image(reference)
    ours = _image(half.pipe)
    assert np.abs(ours * 255 - expected * 255).max() <= 2
