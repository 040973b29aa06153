"""Image-to-image and inpainting on each family's pool, against diffusers' own pipelines built from the same
components (`from_pipe` of a fresh pipeline with the LoRA fused); the pool's weights, scheduler and bytes as they
were; the steps a strength runs, as diffusers counts them."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import (
    FluxImg2ImgPipeline,
    FluxInpaintPipeline,
    FluxPipeline,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
    ZImageImg2ImgPipeline,
    ZImageInpaintPipeline,
    ZImagePipeline,
)

from engine.families.sdxl import FAMILY, build_tiny_pipeline
from engine.pipeline.modes import mode_pipeline
from engine.pipeline.vae import vae_in_float32
from engine.pools.engine import Engine
from engine.requests import CheckedRequest, GenerateRequest, LoraSpec
from tests.support.checks import generate
from tests.support.dit import local_engine, preview_frames
from tests.support.flux import CASES, write_flux_loras
from tests.support.image_inputs import PROMPT, input_image, input_mask, mode_reference, resident_bytes, storages
from tests.support.images import assert_images_close, level_difference
from tests.support.loras import kohya_file
from tests.support.sd15 import write_sd15_loras
from tests.support.zimage import CASES as ZIMAGE_CASES
from tests.support.zimage import write_zimage_loras


@dataclass(frozen=True)
class Pool:
    """A family's pool under test and what its reference needs."""

    engine: Engine
    base_class: Any
    modes: dict[str, Any]
    tiny_dir: Path
    folder: Path
    weight_name: str
    guidance: float
    components: tuple[str, ...] | None = None
    load: tuple[tuple[str, object], ...] = ()


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory: pytest.TempPathFactory, loaded, loaded_sd15, loaded_flux, loaded_zimage) -> Path:
    folder = tmp_path_factory.mktemp("image-mode-loras")
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(loaded.pipe, seed=61))
    write_sd15_loras(loaded_sd15.pipe, folder)
    write_flux_loras(loaded_flux.pipe, folder, cases=CASES[:1])
    write_zimage_loras(loaded_zimage.pipe, folder, cases=ZIMAGE_CASES[:1])
    return folder


@pytest.fixture(params=["sdxl", "sd15", "flux", "zimage"])
def pool(request, lora_folder, base_settings, tiny_dir, tiny_sd15_dir, tiny_flux_dir):
    family = request.param
    loaded, loaded_sd15, loaded_flux = (request.getfixturevalue(f"loaded{s}") for s in ("", "_sd15", "_flux"))
    settings = base_settings.replace(local_lora_dir=lora_folder)
    if family == "sdxl":
        modes = {"image-to-image": StableDiffusionXLImg2ImgPipeline, "inpainting": StableDiffusionXLInpaintPipeline}
        made = (loaded, StableDiffusionXLPipeline, modes, tiny_dir, "sdxl_kohya.safetensors", 5.0, None, ())
    elif family == "sd15":
        modes = {"image-to-image": StableDiffusionImg2ImgPipeline, "inpainting": StableDiffusionInpaintPipeline}
        load = (("safety_checker", None), ("requires_safety_checker", False))
        made = (loaded_sd15, StableDiffusionPipeline, modes, tiny_sd15_dir, "sd15_peft.safetensors", 7.5, None, load)
    elif family == "zimage":
        modes = {"image-to-image": ZImageImg2ImgPipeline, "inpainting": ZImageInpaintPipeline}
        tiny = request.getfixturevalue("tiny_zimage_dir")
        served = request.getfixturevalue("loaded_zimage")
        made = (served, ZImagePipeline, modes, tiny, ZIMAGE_CASES[0].file_name, 0.0, ("transformer",), ())
    else:
        modes = {"image-to-image": FluxImg2ImgPipeline, "inpainting": FluxInpaintPipeline}
        components = ("transformer", "text_encoder")
        made = (loaded_flux, FluxPipeline, modes, tiny_flux_dir, CASES[0].file_name, 3.5, components, ())
    served, base_class, modes, tiny, weight_name, guidance, components, load = made
    with local_engine(served, settings, lora_folder) as engine:
        yield Pool(engine, base_class, modes, tiny, lora_folder, weight_name, guidance, components, load)


def image_request(pool: Pool, *, mask: bool, strength: float = 0.6, steps: int = 5, **more: Any) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT,
        loras=(LoraSpec(f"local:{pool.weight_name}", scale=1.0),),
        steps=steps,
        guidance=pool.guidance,
        seed=7,
        image=input_image(),
        mask_image=input_mask() if mask else None,
        strength=strength,
        **more,
    )


@pytest.mark.parametrize("mode", ["image-to-image", "inpainting"])
def test_each_mode_equals_diffusers_own_pipeline_from_the_same_components(pool, mode):
    inpainting = mode == "inpainting"
    ours = generate(pool.engine, image_request(pool, mask=inpainting))
    assert ours.request.mode == mode and ours.image.size == (64, 64)
    call: dict[str, Any] = {"image": input_image().to_pil(), "strength": 0.6, "num_inference_steps": 5}
    call["guidance_scale"] = pool.guidance
    if inpainting:
        call["mask_image"] = input_mask().to_pil()
    if "width" in inspect.signature(pool.modes[mode].__call__).parameters:
        # Those that take a size default to their own (FLUX's 1024 px), not the image's: ours passes its checked one.
        call |= {"width": 64, "height": 64}
    reference = mode_reference(
        pool.base_class,
        pool.modes[mode],
        pool.tiny_dir,
        pool.folder,
        pool.weight_name,
        components=pool.components,
        load=dict(pool.load),
        **call,
    )
    assert_images_close(ours.image, reference, mode)
    # The LoRA matters: the same request without it differs.
    plain = generate(pool.engine, replace(image_request(pool, mask=inpainting), loras=()))
    assert level_difference(plain.image, ours.image) > 2


def test_strength_runs_its_share_of_the_steps_and_progress_says_so(pool):
    steps: list[tuple[int, int]] = []
    with pool.engine.prepare(image_request(pool, mask=False, strength=0.6, steps=10)) as prepared:
        pool.engine.run(prepared, progress=lambda done, total: steps.append((done, total)))
    assert steps == [(k, 6) for k in range(1, 7)]


def test_an_image_run_leaves_the_pool_as_it_was(pool):
    pipe = pool.engine.loaded.pipe
    text = GenerateRequest(prompt=PROMPT, steps=3, guidance=pool.guidance, width=64, height=64, seed=3)
    before = generate(pool.engine, text).image.tobytes()
    resident = resident_bytes(pipe)
    scheduler = dict(pipe.scheduler.config), type(pipe.scheduler)
    vae_dtype = pipe.vae.dtype
    for mask in (False, True):
        generate(pool.engine, image_request(pool, mask=mask))
    assert resident_bytes(pipe) == resident
    # The mode's pipeline holds the pool's own tensors, no copy: the same storages, counted once.
    for mask in (False, True):
        checked = pool.engine.check(image_request(pool, mask=mask))
        built = mode_pipeline(pipe, checked, pool.engine.loaded.family)
        assert type(built) is pool.modes[checked.mode] and storages(built) == storages(pipe)
    assert (dict(pipe.scheduler.config), type(pipe.scheduler)) == scheduler and pipe.vae.dtype == vae_dtype
    assert generate(pool.engine, text).image.tobytes() == before


def test_the_output_is_the_inputs_size_rounded_or_the_target_size(pool):
    multiple = pool.engine.defaults.side_multiple
    odd = GenerateRequest(prompt=PROMPT, steps=2, seed=1, image=input_image(70, 75), strength=0.5)
    made = generate(pool.engine, odd)
    assert made.image.size == (multiple * round(70 / multiple), multiple * round(75 / multiple))
    target = generate(pool.engine, replace(odd, width=96, height=64))
    assert target.image.size == (96, 64)


def test_pool_defaults_name_diffusers_strengths(loaded, loaded_sd15, loaded_flux, loaded_zimage):
    expected = {id(loaded): (0.3, 0.9999), id(loaded_sd15): (0.8, 1.0), id(loaded_flux): (0.6, 0.6)}
    expected[id(loaded_zimage)] = (0.6, 1.0)
    for served in (loaded, loaded_sd15, loaded_flux, loaded_zimage):
        defaults = served.defaults
        assert (defaults.strength, defaults.inpaint_strength) == expected[id(served)]
        assert defaults.modes == ("text-to-image", "image-to-image", "inpainting") and not defaults.needs_image


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    # Both sides on one thread count: a sum split otherwise would move pixels apart for no reason.
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_previews_come_for_the_steps_an_image_run_makes(loaded_flux, base_settings):
    """Strength 0.6 of 10 steps: previews after steps 1 to 5 (the last one's would race the final image)."""
    settings = base_settings.replace(base_model_id="black-forest-labs/FLUX.1-dev", preview_vae="none", preview_every=1)
    request = GenerateRequest(prompt=PROMPT, steps=10, seed=1, image=input_image(), strength=0.6)
    frames = preview_frames(loaded_flux, settings, request)
    assert [step for step, _ in frames] == [1, 2, 3, 4, 5]


def test_sdxls_image_pipelines_cannot_cast_a_half_precision_pools_float32_vae():
    """SDXL's img2img casts a force_upcast VAE to float32 and back to the run's dtype: on a float16 pool, whose VAE
    loading keeps in float32, that left it in float16 and re-pointed out of its storage (fails without the view)."""
    pipe = build_tiny_pipeline().to(dtype=torch.float16)
    vae_in_float32(pipe)
    before = storages(pipe.vae)
    request = CheckedRequest(prompt="a", steps=4, guidance=5.0, width=64, height=64, seed=1, image=input_image())
    built = mode_pipeline(pipe, replace(request, strength=0.6), FAMILY)
    built(prompt="a", image=input_image().to_pil(), strength=0.6, num_inference_steps=4)
    assert pipe.vae.dtype == torch.float32 and storages(pipe.vae) == before
