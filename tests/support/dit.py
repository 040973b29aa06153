"""What the DiT family tests share (FLUX.1, Z-Image, and each next family): an engine or pools over the tiny
pipelines, diffusers' own reference (`load_lora_weights` + `fuse_lora`), the bit-exact base check, the served
pools for routing, previews, and the memory plan's GPUs and declared sizes. A family's tests keep what is its
own: its LoRA files, its model ids, its numbers."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from diffusers import AutoencoderTiny
from PIL import Image

from engine.families.registry import served_specs
from engine.pools.engine import Engine
from engine.pools.plan import PoolNeed, declared_needs
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.pools.routing import PoolInfo
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from engine.settings import Settings
from engine.weights.quantized import held_branches
from lora_catalog.hub import HubSource
from tests.support.checks import generate

# The family tests' prompt, and the pool tests' small request's.
PROMPT = "a photo of a fox in sks style"
POOL_PROMPT = "a fox in a forest"


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


# -- an engine, pools -----------------------------------------------------------------------------------------


@contextmanager
def local_engine(
    loaded: Any, settings: Settings, lora_dir: Path | None = None, *, max_bytes: int | None = None
) -> Iterator[Engine]:
    """An engine over `loaded` reading LoRAs from `lora_dir` only (no Hub), each file up to `max_bytes`
    (default MAX_ADAPTER_BYTES), closed (its base restored) after."""
    limit = settings.max_adapter_bytes if max_bytes is None else max_bytes
    resolver = AdapterResolver(None, local_dir=lora_dir, token=None, max_bytes=limit)
    engine = Engine(loaded, settings, resolver)
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def hub_pools(
    pipelines: Sequence[tuple[Any, str]], settings: Settings, hub_url: str, lora_dir: Path
) -> Iterator[Pools]:
    """Pools over `(loaded, base model id)` pairs, reading LoRAs from the stand-in Hub and `lora_dir`, taking
    turns on the CPU. Closed after."""
    settings = settings.replace(local_lora_dir=lora_dir)
    resolver = AdapterResolver(
        HubSource(endpoint=hub_url, timeout_s=5),
        local_dir=lora_dir,
        token=None,
        max_bytes=settings.max_adapter_bytes,
    )
    engines = [Engine(loaded, settings.replace(base_model_id=model_id), resolver) for loaded, model_id in pipelines]
    made = Pools(engines, resolver, Residency(torch.device("cpu"), None))
    try:
        yield made
    finally:
        made.close()


def pool_request(*loras: LoraSpec, seed: int = 7) -> GenerateRequest:
    """The pool tests' request: two steps at 64 px."""
    return GenerateRequest(prompt=POOL_PROMPT, loras=tuple(loras), steps=2, width=64, height=64, seed=seed)


def pool_of(pools: Pools, *refs: str) -> str:
    """The base model id of the pool these LoRAs route to."""
    return pools.route(pool_request(*(LoraSpec(r) for r in refs))).pool.base_model_id


def response_image(response: httpx.Response) -> bytes:
    """An HTTP answer's PNG as RGB bytes, to compare with an engine's image."""
    return Image.open(io.BytesIO(response.content)).convert("RGB").tobytes()


def served_pools(tiny_pipes: dict[Any, Any]) -> list[PoolInfo]:
    """Each served family's tiny pipeline as a pool routing would pick among, with its widths."""
    pools = []
    for spec in served_specs():
        pipe = tiny_pipes[spec.family]
        encoders = {c: getattr(pipe, c) for c in spec.components if c != spec.denoiser}
        widths = spec.signature.pipeline_widths(getattr(pipe, spec.denoiser), encoders)
        pools.append(PoolInfo(f"base/{spec.family}", spec.family, widths.denoiser, widths.text))
    return pools


# -- references and exactness ---------------------------------------------------------------------------------


def diffusers_image(
    pipeline_class: Any,
    tiny_dir: Path,
    folder: Path,
    weight_name: str | None,
    *,
    components: Sequence[str],
    scale: float = 1.0,
    guidance: float,
) -> Image.Image:
    """diffusers' own result on a pipeline of its own from `tiny_dir`: load_lora_weights, then fuse_lora of
    `components` (its default fuses the transformer only), three steps at 64 px, seed 7; no LoRA when
    `weight_name` is None."""
    pipe = pipeline_class.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a0")
        pipe.fuse_lora(components=list(components), lora_scale=scale)
    generator = torch.Generator("cpu").manual_seed(7)
    return pipe(
        prompt=PROMPT, num_inference_steps=3, guidance_scale=guidance, width=64, height=64, generator=generator
    ).images[0]


def assert_components_pristine(pipe: Any, pristine: dict[str, Any], names: Sequence[str]) -> None:
    """Every tensor of each named component equals its pristine copy, bit for bit, and a quantized denoiser's LoRA
    branches are all zero (`held_branches`: whatever `branch_rank` says, the padded formula reads every buffer)."""
    for name in names:
        component = getattr(pipe, name)
        assert held_branches(component) == [], f"{name} still holds LoRA branches"
        for key, value in component.state_dict().items():
            assert torch.equal(value, pristine[f"{name}.{key}"]), f"{name}.{key} drifted"


def assert_swaps_exact(loaded: Any, settings: Settings, lora_dir: Path, cases: Sequence[Any]) -> None:
    """Each case's LoRA file in `lora_dir` changes the image, and after them the transformer and the base image
    are bit-exact (the GPU tests' round trip, in the pipeline's own dtype)."""
    with local_engine(loaded, settings.replace(local_lora_dir=lora_dir), lora_dir, max_bytes=2**30) as engine:
        transformer = loaded.pipe.transformer
        before = {k: v.clone() for k, v in transformer.state_dict().items()}
        request = GenerateRequest("a fox", steps=2, width=64, height=64, seed=1)
        base = generate(engine, request).image
        for case in cases:
            lora = generate(engine, GenerateRequest("a fox", loras=(LoraSpec(f"local:{case.file_name}"),), seed=1))
            assert lora.image.tobytes() != base.tobytes(), case.name
        engine.restore_base_weights()
        assert all(torch.equal(v, before[k]) for k, v in transformer.state_dict().items())
        assert generate(engine, request).image.tobytes() == base.tobytes()


# -- previews ---------------------------------------------------------------------------------------------------


def save_taef1(folder: Path) -> AutoencoderTiny:
    """TAEF1's architecture with random weights (seed 0), saved to `folder` for PREVIEW_VAE."""
    torch.manual_seed(0)
    taef1 = AutoencoderTiny(latent_channels=16)
    taef1.save_pretrained(folder)
    return taef1


def preview_frames(loaded: Any, settings: Settings, request: GenerateRequest) -> list[tuple[int, Image.Image]]:
    """The previews one run of `request` sends, as (step, image)."""
    frames: list[tuple[int, Image.Image]] = []

    def add(step: int, image: Image.Image) -> None:
        frames.append((step, image))

    with local_engine(loaded, settings) as engine, engine.prepare(request) as prepared:
        engine.run(prepared, preview=add)
    return frames


# -- the memory plan ---------------------------------------------------------------------------------------------

# A host that holds whatever a plan places there: these tests judge the GPU side (the host side: test_hostplan).
HOST_RAM = 2**40
GIB = 2**30
# What torch reports for these GPUs' memory (as in tests/engine/pools/test_plan.py).
A10G = 23_028 * 2**20
L40S = 46_068 * 2**20

# FLUX.1 [dev]'s vae/config.json (Z-Image Turbo's too), the fields that differ from diffusers' defaults.
FLUX1_VAE = {
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}


def values(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()))


def needs_on_a_gpu(settings: Settings) -> tuple[PoolNeed, ...]:
    # DTYPE=auto as on a GPU: each family's half precision (the DiTs bf16, SDXL fp16); nothing touches CUDA.
    needs = declared_needs(settings, torch.device("cuda"))
    assert needs is not None
    return needs


def pipeline_image(loaded: Any) -> np.ndarray:
    """The pipeline's own call, two steps at 64 px, one seed."""
    generator = torch.Generator("cpu").manual_seed(7)
    out = loaded.pipe(prompt=POOL_PROMPT, num_inference_steps=2, width=64, height=64, generator=generator)
    return np.asarray(out.images[0], dtype=np.int16)
