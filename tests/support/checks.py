"""Helpers shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from engine.errors import (
    AdapterLoadError,
    GatedLoraError,
    IncompatibleLoraError,
    LimitExceededError,
    LoraNotFoundError,
    SwitchboardError,
    UnsupportedLoraVariantError,
)
from engine.requests import GenerateRequest, LoraSpec
from lora_catalog.errors import AmbiguousWeightsError, PickleOnlyError


def assert_pristine(loaded, pristine) -> None:
    for name in ("unet", "text_encoder", "text_encoder_2"):
        for key, value in getattr(loaded.pipe, name).state_dict().items():
            assert torch.equal(value, pristine[f"{name}.{key}"]), f"{name}.{key} drifted"


PROMPT = "a lighthouse on a cliff"


def small(*loras: LoraSpec, seed: int = 5, steps: int = 1, prompt: str = PROMPT) -> GenerateRequest:
    """A request the tiny pipeline answers in about a tenth of a second."""
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=steps, width=64, height=64, seed=seed)


@contextmanager
def unchanged(engine, loaded, pristine) -> Iterator[None]:
    """The block must leave the served set as it was; when that set is the base, every weight bit-exact."""
    before = engine.status().applied
    yield
    assert engine.status().applied == before
    if not before:
        assert_pristine(loaded, pristine)


# role -> (error class, message fragment): what a request for that fixture repo must raise.
BAD_REPOS: dict[str, tuple[type[SwitchboardError], str]] = {
    "truncated": (AdapterLoadError, r"not a valid safetensors file: .*file truncated"),
    "lying-header": (AdapterLoadError, r"not a valid safetensors file: .*the offsets lie about the data"),
    "lying-shape": (AdapterLoadError, r"not a valid safetensors file: .*the offsets lie about the data"),
    "huge-header": (AdapterLoadError, r"declared header length 1099511627776 bytes is over the limit"),
    "nan": (AdapterLoadError, r"holds NaN or infinite values in 'unet\..*'; accepted: finite weights only"),
    "inf": (AdapterLoadError, r"holds NaN or infinite values in '.*'; accepted: finite weights only"),
    "wrong-shapes": (IncompatibleLoraError, r"factors \(640, 4\) x \(4, 640\) do not fit unet\..* of shape \(64, 64\)"),
    "unknown-keys": (IncompatibleLoraError, r"targets unet\.down_blocks\.7\..*which the served pipeline lacks"),
    "high-rank": (LimitExceededError, r"has rank 64; accepted: rank up to 32"),
    "pickle-only": (PickleOnlyError, r"only pickle weights \('pytorch_lora_weights\.bin'\).*never unpickled"),
    "ckpt-only": (PickleOnlyError, r"only pickle weights \('model\.ckpt', 'model\.pt'\).*never unpickled"),
    "several": (
        AmbiguousWeightsError,
        r"several \.safetensors files \('a\.safetensors', 'b\.safetensors'\).*weight_name",
    ),
    "gated": (GatedLoraError, r"'fixtures/gated' is gated .*only LoRAs anyone can download"),
    "private": (LoraNotFoundError, r"'fixtures/private' was not found on the Hub \(or it is private\)"),
    "sd15": (IncompatibleLoraError, r"made for stable-diffusion-v1-5/stable-diffusion-v1-5 \(sd15\).*sdxl family"),
    "flux": (IncompatibleLoraError, r"made for black-forest-labs/FLUX\.1-dev \(flux\).*sdxl family"),
    "sd15-meta": (IncompatibleLoraError, r"trained for the sd15 family; this Space serves .*sdxl"),
    "oft": (UnsupportedLoraVariantError, r"uses OFT, which the fused swap cannot apply; accepted: plain LoRA, LoCon"),
    "ia3": (UnsupportedLoraVariantError, r"uses IA3, which the fused swap cannot apply; accepted: .*LoHa, LoKr"),
    "full-diff": (UnsupportedLoraVariantError, r"uses full weight differences, which .*cannot apply; accepted: .*DoRA"),
    "lora-bias": (UnsupportedLoraVariantError, r"uses LoRA bias terms, which the fused swap cannot apply"),
}


def prime(make_engine, fixtures, **overrides: object):
    """An engine serving fixtures['peft'] at 0.7, that spec, and the image `small(spec)` gives."""
    engine = make_engine(**overrides)
    good = LoraSpec(fixtures["peft"], scale=0.7)
    image = engine.generate(small(good)).image.tobytes()
    return engine, good, image


SECRET = "hf_secret_Zq8v3KfT0pLmN2xYwR7sAbCdEfGh"

# Every logger that could see a request: ours, the Hub client and the HTTP stacks under it.
LOGGERS = ("", "engine", "lora_catalog", "huggingface_hub", "httpx", "httpx2", "httpcore", "urllib3", "tests")
