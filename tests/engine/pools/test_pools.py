"""Pools: routing by a LoRA's own base, refusals, concurrency across pools, exactness, and offloading."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from engine.errors import IncompatibleLoraError, InvalidRequestError, UnservedBaseError
from engine.pools.engine import Engine
from engine.pools.flat import FlatWeights, module_bytes
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.prepare.resolve import AdapterResolver
from engine.requests import GenerateRequest, LoraSpec
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from lora_catalog.hub import HubSource
from serving.backends import blocking
from serving.demo.synthetic import LoraTarget, find_targets, kohya_metadata, make_lora, peft_metadata, save_lora
from tests.support.checks import backend_of, generate
from tests.support.dit import assert_components_pristine
from tests.support.images import assert_images_close
from tests.support.loras import FLUX, SDXL, card, kohya_file, peft_file, sft
from tests.support.mixed import assert_mixed_clients_get_their_own_images
from tests.support.mixed import mixed_request as mixed
from tests.support.sd15 import write_sd15_loras

MID_CROSS = r"mid_block\.attentions\.0\.transformer_blocks\.0\.attn2\.(to_k|to_v)$"


def request(*loras: LoraSpec, seed: int = 7, prompt: str = "a fox in a forest") -> GenerateRequest:
    return GenerateRequest(prompt=prompt, loras=tuple(loras), steps=2, width=64, height=64, seed=seed)


def shapes_only(pipe, seed: int) -> dict[str, torch.Tensor]:
    """A LoRA whose names fit both tiny UNets (the mid block's cross-attention) and that declares nothing."""
    targets: list[LoraTarget] = find_targets({"unet": pipe.unet}, {"unet": (MID_CROSS,)})
    return make_lora(targets, rank=2, seed=seed, fmt="peft", strength=0.5)


@pytest.fixture(scope="module")
def lora_dir(loaded, loaded_sd15, hub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pool-loras")
    sd15 = write_sd15_loras(loaded_sd15.pipe, folder)
    (folder / "sd15_peft.safetensors").rename(folder / "sd15_peft_meta.safetensors")
    assert sd15["kohya"] == "sd15_kohya.safetensors"
    # Metadata only: kohya's ss_base_model_version / modelspec, no card.
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=61))
    # Shapes only: no card, no metadata, names both UNets have.
    save_lora(folder / "shapes_sd15.safetensors", shapes_only(loaded_sd15.pipe, 62))
    save_lora(folder / "shapes_sdxl.safetensors", shapes_only(loaded.pipe, 63))
    # By card only: files without metadata, on the stand-in Hub with a card naming the base.
    sd15_targets = find_targets({"unet": loaded_sd15.pipe.unet}, {"unet": (r"attn1\.to_q$",)})
    sd15_plain = make_lora(sd15_targets, rank=2, seed=64, fmt="peft", strength=0.5)
    hub.add_repo(
        "pools/sd15-card", {"README.md": card("runwayml/stable-diffusion-v1-5"), "lora.safetensors": sft(sd15_plain)}
    )
    hub.add_repo(
        "pools/sdxl-card", {"README.md": card(SDXL), "lora.safetensors": peft_file(loaded.pipe, seed=65, alpha=None)}
    )
    hub.add_repo("pools/flux-card", {"README.md": card(FLUX), "lora.safetensors": peft_file(loaded.pipe, seed=66)})
    assert kohya_metadata(dim=1, alpha=1.0, base_version="sd_v1")["ss_base_model_version"] == "sd_v1"
    assert "lora_adapter_metadata" in peft_metadata([], rank=1, alpha=1.0)
    return folder


def make_pools(loaded, loaded_sd15, base_settings, hub, lora_dir: Path, budget: int | None = None) -> Pools:
    settings = base_settings.replace(local_lora_dir=lora_dir)
    resolver = AdapterResolver(
        HubSource(endpoint=hub.url, timeout_s=5), local_dir=lora_dir, token=None, max_bytes=settings.max_adapter_bytes
    )
    engines = [
        Engine(loaded, settings, resolver),
        Engine(loaded_sd15, settings.replace(base_model_id=SD15_MODEL_ID), resolver),
    ]
    return Pools(engines, resolver, Residency(torch.device("cpu"), budget))


@pytest.fixture
def pools(loaded, loaded_sd15, base_settings, clean_hub, lora_dir):
    made = make_pools(loaded, loaded_sd15, base_settings, clean_hub, lora_dir)
    yield made
    made.close()


def pool_of(pools: Pools, *refs: str, base: str = "") -> str:
    return pools.route(request(*(LoraSpec(r) for r in refs)), base).pool.base_model_id


# -- routing -----------------------------------------------------------------------------------------


def test_a_lora_is_routed_by_its_card(pools):
    assert pool_of(pools, "pools/sd15-card") == SD15_MODEL_ID
    assert pool_of(pools, "pools/sdxl-card") == SDXL
    result = generate(pools, request(LoraSpec("pools/sd15-card")))
    assert result.adapters[0].ref == "pools/sd15-card"


def test_a_lora_is_routed_by_its_metadata_alone(pools):
    assert pool_of(pools, "local:sd15_kohya.safetensors") == SD15_MODEL_ID
    assert pool_of(pools, "local:sdxl_kohya.safetensors") == SDXL


def test_a_lora_is_routed_by_its_shapes_alone(pools):
    assert pool_of(pools, "local:shapes_sd15.safetensors") == SD15_MODEL_ID
    assert pool_of(pools, "local:shapes_sdxl.safetensors") == SDXL
    # And the routed pool really runs it: the same LoRA on the other base would not fit.
    generate(pools, request(LoraSpec("local:shapes_sd15.safetensors")))
    with pytest.raises(IncompatibleLoraError):
        generate(pools.default.engine, request(LoraSpec("local:shapes_sd15.safetensors")))


def test_loras_of_two_bases_in_one_request_are_refused_naming_each_base(pools):
    with pytest.raises(InvalidRequestError, match=r"share one base model") as caught:
        generate(pools, request(LoraSpec("local:sd15_kohya.safetensors"), LoraSpec("pools/sdxl-card")))
    assert caught.value.status == 400
    assert "'local:sd15_kohya.safetensors' is for stable-diffusion-v1-5/stable-diffusion-v1-5" in str(caught.value)
    assert f"'pools/sdxl-card' is for {SDXL}" in str(caught.value)
    with pytest.raises(InvalidRequestError, match=r"the request names"):
        pools.route(request(LoraSpec("pools/sdxl-card")), SD15_MODEL_ID)


def test_unserved_bases_are_404s_naming_the_served_ones(pools):
    with pytest.raises(UnservedBaseError, match=r"FLUX.1-dev.*served: stabilityai.*stable-diffusion-v1-5") as caught:
        generate(pools, request(LoraSpec("pools/flux-card")))
    assert caught.value.status == 404
    with pytest.raises(UnservedBaseError, match=r"'black-forest-labs/FLUX.1-dev' is not served here; served: "):
        generate(pools, request(), base=FLUX)


def test_without_a_lora_the_named_base_or_the_default_pool_generates(pools):
    assert pool_of(pools) == SDXL
    assert pool_of(pools, base=SD15_MODEL_ID.upper()) == SD15_MODEL_ID
    on_sd15 = generate(pools, request(), base=SD15_MODEL_ID).image
    assert on_sd15.tobytes() == generate(pools.pools[1].engine, request()).image.tobytes()
    assert on_sd15.tobytes() != generate(pools, request()).image.tobytes()


# -- concurrency and exactness -----------------------------------------------------------------------

MIXED = (
    (),
    ("local:sd15_kohya.safetensors",),
    ("local:sdxl_kohya.safetensors",),
    ("local:shapes_sd15.safetensors",),
    ("pools/sd15-card",),
    ("pools/sdxl-card",),
    ("local:sd15_peft_meta.safetensors",),
    ("local:shapes_sdxl.safetensors",),
)


def mixed_request(index: int) -> tuple[GenerateRequest, str]:
    return mixed(MIXED, SD15_MODEL_ID, index)


# Dozens of generations: within the default 300 s on an idle 2-core box, not on a shared one.
@pytest.mark.timeout(900)
def test_eight_clients_across_both_pools_get_exactly_their_own_images(pools):
    assert_mixed_clients_get_their_own_images(pools, [mixed_request(i) for i in range(24)])


@pytest.mark.timeout(900)
def test_both_bases_are_bit_exact_after_a_long_mixed_run(pools, loaded, loaded_sd15, pristine, pristine_sd15):
    base_images = [generate(pools, request(), base=b).image.tobytes() for b in (SDXL, SD15_MODEL_ID)]
    rng = np.random.default_rng(3)
    for step in range(32):
        mixed, base = mixed_request(int(rng.integers(0, 1000)))
        # One step: the weights are what this test checks, and a swap happens before any step.
        generate(pools, dataclasses.replace(mixed, steps=1), base=base)
        if step % 9 == 4:
            with pytest.raises(InvalidRequestError):
                generate(pools, request(LoraSpec("local:sd15_kohya.safetensors"), LoraSpec("pools/sdxl-card")))
    for pool in pools.pools:
        pool.engine.restore_base_weights()
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2"))
    assert_components_pristine(loaded_sd15.pipe, pristine_sd15, ("unet", "text_encoder"))
    assert [generate(pools, request(), base=b).image.tobytes() for b in (SDXL, SD15_MODEL_ID)] == base_images


# -- memory ------------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_an_offloaded_pool_comes_back_bit_exact(
    loaded, loaded_sd15, base_settings, clean_hub, lora_dir, pristine, pristine_sd15
):
    modules = [
        [m for m in lp.pipe.components.values() if isinstance(m, torch.nn.Module)] for lp in (loaded, loaded_sd15)
    ]
    # Start both runs from fresh copies: with the pipelines still in the storage from_pretrained gave them, the
    # first LoRA images came out different from those after any copy although every weight and buffer compared
    # bit-equal: where a weight lives picks the kernel on some CPUs, and so the last bit of some sums (issue 28).
    for group in modules:
        FlatWeights(group, pin=False).to_device(torch.device("cpu"))
    reference = make_pools(loaded, loaded_sd15, base_settings, clean_hub, lora_dir)
    work = [mixed_request(i) for i in (1, 2, 3, 4, 5, 0, 6, 7)]
    expected = [generate(reference, r, base=b).image for r, b in work]
    reference.close()
    sizes = [module_bytes(group) for group in modules]
    # Room for either pipeline, not both: every switch of base moves one out and the other in.
    pools = make_pools(loaded, loaded_sd15, base_settings, clean_hub, lora_dir, budget=max(sizes))
    try:
        assert [m.resident for m in (s.memory for s in pools.status())] == [True, False]
        got = [generate(pools, r, base=b).image for r, b in work]
        memory = {s.base_model_id: s.memory for s in pools.status()}
        assert memory[SD15_MODEL_ID].moves_in >= 2 and memory[SDXL].moves_in >= 2
        assert sum(m.resident for m in memory.values()) == 1
        # Each move put the weights into new flat buffers: other storage, so the images agree within 2 levels
        # (tests/support/images.py); the weights themselves come back bit-exact (below).
        for index, (image, wanted) in enumerate(zip(got, expected, strict=True)):
            assert_images_close(image, wanted, work[index])
    finally:
        pools.close()
    assert_components_pristine(loaded.pipe, pristine, ("unet", "text_encoder", "text_encoder_2", "vae"))
    assert_components_pristine(loaded_sd15.pipe, pristine_sd15, ("unet", "text_encoder", "vae"))


# -- transports ---------------------------------------------------------------------------------------


def test_every_transport_goes_through_the_backend_to_the_right_pool(pools):
    from engine.compare import CompareRequest
    from tests.support.app_server import serve_routes

    backend = backend_of(pools)
    body = '{"inputs": "a fox in a forest", "parameters": {"num_inference_steps": 2, "seed": 7}}'
    png = {"accept": "image/png"}
    with serve_routes(backend) as url:
        named = httpx.post(f"{url}models/{SD15_MODEL_ID}", content=body, headers=png, timeout=120)
        assert named.status_code == 200, named.text[:300]
        expected = generate(pools, request(), base=SD15_MODEL_ID).image
        assert Image.open(io.BytesIO(named.content)).convert("RGB").tobytes() == expected.tobytes()
        by_lora = httpx.post(url, content=body, headers={"lora": "local:sd15_kohya.safetensors", **png}, timeout=120)
        assert by_lora.status_code == 200, by_lora.text[:300]
        wanted = generate(pools, request(LoraSpec("local:sd15_kohya.safetensors"))).image
        assert Image.open(io.BytesIO(by_lora.content)).convert("RGB").tobytes() == wanted.tobytes()
        mixed = httpx.post(
            f"{url}models/{SD15_MODEL_ID}", content=body, headers={"lora": "pools/sdxl-card"}, timeout=120
        )
        assert mixed.status_code == 400
        assert "the request names stable-diffusion-v1-5/stable-diffusion-v1-5" in mixed.json()["error"]
        flux = httpx.post(url, content=body, headers={"lora": "pools/flux-card"}, timeout=120)
        assert flux.status_code == 404
        assert flux.json()["error_type"] == "UnservedBaseError"
    grid = blocking(
        backend.compare(
            CompareRequest(
                prompt="a fox in a forest", loras=(LoraSpec("pools/sd15-card"),), scales=(0.5, 1.0), steps=2, seed=7
            )
        )
    )
    assert [r.request.width for r in grid.results] == [64, 64]
    alone = generate(pools, request(LoraSpec("pools/sd15-card", scale=1.0)))
    assert grid.results[1].image.tobytes() == alone.image.tobytes()
    with pytest.raises(InvalidRequestError, match=r"share one base model"):
        blocking(
            backend.compare(
                CompareRequest(prompt="x", loras=(LoraSpec("pools/sd15-card"), LoraSpec("pools/sdxl-card")), steps=2)
            )
        )
