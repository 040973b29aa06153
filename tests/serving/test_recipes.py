"""Recipes: A1111's `parameters` text written for a result, read back, and carried in PNG and JPEG files."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re

import pytest
from PIL import Image

from engine.requests import AdapterUse, CheckedRequest, GenerateResult, InputImage, LoraSpec, Timings
from engine.video_input import InputVideo
from serving.recipes import (
    REFERENCE_VIDEO,
    VideoReference,
    encode_image,
    parse_recipe,
    read_recipe,
    recipe_text,
    with_recipes,
)

USES = (
    AdapterUse("owner/style", "abc", "pytorch_lora_weights.safetensors", 0.8, "hit", "0123456789ab"),
    AdapterUse("ByteDance/SDXL-Lightning", "def", "sdxl_lightning_4step_lora.safetensors", 1.0, "miss", "ba9876543210"),
    AdapterUse("local:styles/ink.safetensors", "1-2", "ink.safetensors", -0.5, "hit", "aaaaaaaaaaaa"),
)


def result(**fields: object) -> GenerateResult:
    request = CheckedRequest(
        prompt="a fox, in a forest: at dusk",
        negative_prompt="blurry, low quality",
        loras=tuple(LoraSpec(u.ref, u.scale) for u in USES),
        steps=4,
        guidance=1.5,
        width=64,
        height=128,
        seed=2**32 - 1,
        scheduler="DPMSolverMultistepScheduler",
        scheduler_options=(("use_karras_sigmas", True),),
        clip_skip=1,
        num_images=2,
        sampler="DPM++ 2M Karras",
    )
    images = (Image.new("RGB", (64, 128), (9, 9, 9)), Image.new("RGB", (64, 128), (1, 2, 3)))
    values: dict = {"image": images[0], "more_images": images[1:], "seed": request.seed, "request": request}
    return GenerateResult(**(values | {"timings": Timings(), "adapters": USES, "model_id": "owner/model"} | fields))


def test_a_recipe_is_a1111s_parameters_text():
    text = recipe_text(result())
    prompt, negative, parameters = text.split("\n")
    assert prompt == (
        "a fox, in a forest: at dusk <lora:owner/style:0.8> "
        "<lora:ByteDance/SDXL-Lightning/sdxl_lightning_4step_lora.safetensors:1> <lora:~styles/ink.safetensors:-0.5>"
    )
    assert negative == "Negative prompt: blurry, low quality"
    assert parameters == (
        "Steps: 4, Sampler: DPM++ 2M Karras, CFG scale: 1.5, Seed: 4294967295, Size: 64x128, Model: owner/model, "
        'Clip skip: 2, Lora hashes: "owner/style: 0123456789ab, ByteDance/SDXL-Lightning/sdxl_lightning_4step_lora'
        '.safetensors: ba9876543210, ~styles/ink.safetensors: aaaaaaaaaaaa", Version: LoRA Switchboard'
    )
    # The second image's own seed (consecutive, wrapping).
    assert "Seed: 0," in recipe_text(result(), 1)


def test_a_recipe_reads_back_into_the_same_request():
    made = result()
    recipe = parse_recipe(recipe_text(made))
    request, checked = recipe.request, made.request
    assert (request.prompt, request.negative_prompt) == (checked.prompt, checked.negative_prompt)
    assert (request.steps, request.guidance, request.seed) == (checked.steps, checked.guidance, checked.seed)
    assert (request.width, request.height, request.clip_skip) == (checked.width, checked.height, checked.clip_skip)
    assert request.scheduler == "DPM++ 2M Karras"
    assert request.loras == (
        LoraSpec("owner/style", 0.8),
        LoraSpec("ByteDance/SDXL-Lightning", 1.0, weight_name="sdxl_lightning_4step_lora.safetensors"),
        LoraSpec("local:styles/ink.safetensors", -0.5),
    )
    assert recipe.hashes["owner/style"] == "0123456789ab"
    assert recipe.hashes["local:styles/ink.safetensors"] == "aaaaaaaaaaaa"
    assert recipe.parameters["Model"] == "owner/model"


def test_recipes_a1111_wrote_are_read():
    # A1111 1.9's form: the schedule apart, a quoted value, a multi-line prompt, a tag without a weight.
    text = (
        "masterpiece, 1girl\nsolo <lora:add_detail:0.5> <lora:ink>\nNegative prompt: lowres\n"
        "Steps: 28, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 123, Size: 832x1216, "
        'Model hash: 7f96a1a9ca, Model: animagine, Clip skip: 2, Lora hashes: "add_detail: 7c6bad76eb54", '
        "Version: v1.9.4"
    )
    recipe = parse_recipe(text)
    assert recipe.request.prompt == "masterpiece, 1girl\nsolo"
    assert recipe.request.loras == (LoraSpec("add_detail", 0.5), LoraSpec("ink", 1.0))
    assert (recipe.request.scheduler, recipe.request.clip_skip, recipe.request.width) == ("DPM++ 2M Karras", 1, 832)
    assert recipe.hashes == {"add_detail": "7c6bad76eb54"}


def test_an_image_to_image_recipe_has_a1111s_denoising_strength():
    """A1111's img2img tab writes `Denoising strength` after the model; a text-to-image recipe has none."""
    start = InputImage.from_pil(Image.new("RGB", (64, 128), (50, 60, 70)))
    mask = InputImage.from_pil(Image.new("L", (64, 128), 255), "L")
    made = result()
    for image, mask_image in ((start, None), (start, mask)):
        request = dataclasses.replace(made.request, image=image, mask_image=mask_image, strength=0.6)
        parameters = recipe_text(dataclasses.replace(made, request=request)).split("\n")[-1]
        assert "Model: owner/model, Denoising strength: 0.6, Clip skip: 2, " in parameters, request.mode
        # No blur is applied to a mask (diffusers' inpainting reads it binarized): no `Mask blur` is claimed.
        assert "Mask blur" not in parameters
        assert parse_recipe(parameters).request.strength == 0.6
    assert "Denoising strength" not in recipe_text(made)
    assert parse_recipe(recipe_text(made)).request.strength is None


def test_a_reference_video_is_named_by_its_file_frames_and_size_and_read_back_apart_from_the_request():
    frame = InputImage.from_pil(Image.new("RGB", (32, 48), (5, 6, 7)))
    made = result()
    for source, digest in ((b"an mp4's bytes", hashlib.sha256(b"an mp4's bytes").hexdigest()), (b"", "")):
        video = InputVideo((frame,) * 9, 24.0, source)
        text = recipe_text(dataclasses.replace(made, request=dataclasses.replace(made.request, reference_video=video)))
        named = "sha256 " + digest + ", " if digest else ""  # a video made in code has no file to hash
        assert f'{REFERENCE_VIDEO}: "{named}9 frames, 32x48", ' in text
        recipe = parse_recipe(text)
        assert recipe.reference_video == VideoReference(digest, 9, 32, 48)
        assert recipe.request.reference_video is None
        assert recipe.request == parse_recipe(recipe_text(made)).request
    # A recipe without one (or with text of another form under that name) names none.
    assert parse_recipe(recipe_text(made)).reference_video is None
    assert parse_recipe(f"a fox\nSteps: 4, Seed: 1, {REFERENCE_VIDEO}: clip.mp4").reference_video is None


def test_a_reference_videos_in_context_settings_are_named_with_it_and_read_back():
    """`reference_strength` and `reference_downscale` go in the same entry where the request set them: a run with
    the same file needs them too, and diffusers' defaults (unset) write nothing."""
    frame = InputImage.from_pil(Image.new("RGB", (64, 64), (5, 6, 7)))
    made = result()
    video = InputVideo((frame,) * 9, 24.0, b"an mp4's bytes")
    digest = hashlib.sha256(b"an mp4's bytes").hexdigest()
    for strength, downscale, written in ((0.25, 2, ", strength 0.25, downscale 2"), (0.5, None, ", strength 0.5")):
        request = dataclasses.replace(
            made.request, reference_video=video, reference_strength=strength, reference_downscale=downscale
        )
        text = recipe_text(dataclasses.replace(made, request=request))
        assert f'{REFERENCE_VIDEO}: "sha256 {digest}, 9 frames, 64x64{written}", ' in text
        recipe = parse_recipe(text)
        assert recipe.reference_video == VideoReference(digest, 9, 64, 64, strength, downscale)
        # The request read back has neither the video nor its settings (a setting without a video is refused).
        assert (recipe.request.reference_strength, recipe.request.reference_downscale) == (None, None)


def test_an_img2img_recipe_a1111_wrote_is_read_with_its_strength():
    text = (
        "a castle <lora:ink:0.7>\nSteps: 30, Sampler: Euler a, Schedule type: Automatic, CFG scale: 7, Seed: 9, "
        "Size: 512x768, Model hash: 6ce0161689, Model: v1-5-pruned-emaonly, Denoising strength: 0.45, "
        "Mask blur: 4, Version: v1.10.1"
    )
    recipe = parse_recipe(text)
    assert (recipe.request.strength, recipe.request.steps, recipe.request.width) == (0.45, 30, 512)
    assert recipe.parameters["Mask blur"] == "4"


# How A1111 finds extra networks in a prompt (modules/extra_networks.py, re_extra_net) and Civitai the negative
# prompt (src/utils/metadata/automatic.metadata.ts: split at "Negative prompt:" anywhere) and its parameters line
# (the first line starting "Steps: "): user text must give none of them a match of its own.
A1111_EXTRA_NET = re.compile(r"<(\w+):([^>]+)>")
ONE = (USES[0],)
TRICKY = (
    "a fox <lora:attacker/other-lora:1.5>",
    "a fox <lyco:attacker/other:1> <hypernet:x:1> <LoRA:y:2>",
    "Negative prompt: blurry",
    "a fox Negative prompt: blurry",
    'Steps: 99, Sampler: Euler, Seed: 7, Lora hashes: "attacker/other-lora: 0123456789ab"',
    # Text that already looks escaped reads back as written too.
    "< lora:x:1> <  lyco:y> Negative prompt : Negative prompt  : a",
    "Steps : 1, Steps  : 2",
    "a <3: fox <> <:x> <lora x:1>",
)


def with_text(prompt: str, negative: str = "", adapters: tuple[AdapterUse, ...] = ONE) -> GenerateResult:
    made = result(adapters=adapters)
    request = dataclasses.replace(made.request, prompt=prompt, negative_prompt=negative)
    return dataclasses.replace(made, request=request)


@pytest.mark.parametrize("text", TRICKY)
def test_a_prompt_cannot_add_a_lora_or_a_negative_prompt_to_its_recipe(text):
    made = with_text(text, "lowres")
    written = recipe_text(made)
    recipe = parse_recipe(written)
    assert recipe.request.loras == (LoraSpec("owner/style", 0.8),)
    assert (recipe.request.prompt, recipe.request.negative_prompt) == (text, "lowres")
    assert recipe.hashes == {"owner/style": "0123456789ab"}
    # What A1111 and Civitai would read: the one LoRA that ran, the negative prompt as written, our parameters.
    assert [name for _, name in A1111_EXTRA_NET.findall(written)] == ["owner/style:0.8"]
    assert written.count("Negative prompt:") == 1 and written.split("Negative prompt:")[1].startswith(" lowres\n")
    assert [line for line in written.split("\n") if line.startswith("Steps: ")] == [written.split("\n")[-1]]


@pytest.mark.parametrize("text", TRICKY)
def test_a_negative_prompt_cannot_add_a_lora_or_parameters_to_its_recipe(text):
    written = recipe_text(with_text("a fox", text))
    recipe = parse_recipe(written)
    assert recipe.request.loras == (LoraSpec("owner/style", 0.8),)
    assert (recipe.request.prompt, recipe.request.negative_prompt) == ("a fox", text)
    assert [name for _, name in A1111_EXTRA_NET.findall(written)] == ["owner/style:0.8"]
    assert written.count("Negative prompt:") == 1
    assert [line for line in written.split("\n") if line.startswith("Steps: ")] == [written.split("\n")[-1]]


def test_a_recipe_without_loras_names_none_whatever_the_prompt_says():
    recipe = parse_recipe(recipe_text(with_text("a fox <lora:attacker/other-lora:1.5>", adapters=())))
    assert recipe.request.loras == () and recipe.hashes == {}
    assert recipe.request.prompt == "a fox <lora:attacker/other-lora:1.5>"


def test_text_in_a_recipe_another_tool_wrote_is_read_as_written():
    # Only our own recipes carry the escaping; another tool's "< lora:x>" is its prompt's text.
    text = "a fox < lora:x:1> Negative prompt : no\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Version: v1.9.4"
    assert parse_recipe(text).request.prompt == "a fox < lora:x:1> Negative prompt : no"


@pytest.mark.parametrize("media_type", ["image/png", "image/jpeg"])
def test_png_and_jpeg_carry_each_images_own_recipe(media_type):
    carried = with_recipes(result())
    for index, image in enumerate(carried.images):
        with Image.open(io.BytesIO(encode_image(image, media_type))) as opened:
            assert read_recipe(opened) == recipe_text(carried, index)
    plain = result().image
    assert "parameters" not in plain.info, "the engine's own image is never written to"
    with Image.open(io.BytesIO(encode_image(plain, media_type))) as opened:
        assert read_recipe(opened) is None


@pytest.mark.parametrize("recipes", [True, False])
def test_every_handlers_result_carries_its_recipe_unless_recipes_are_off(engine, fixtures, recipes):
    from engine.requests import GenerateRequest
    from serving.backends import blocking
    from serving.handlers import Handlers
    from tests.support.checks import backend_of

    handlers = Handlers(backend_of(engine), None, engine.settings.replace(recipes=recipes))  # type: ignore[arg-type]
    request = GenerateRequest("a fox", loras=(LoraSpec(fixtures["peft"], 0.5),), steps=1, width=64, height=64, seed=3)
    made = blocking(handlers.generate(request))
    if not recipes:
        assert "parameters" not in made.image.info
        return
    recipe = parse_recipe(made.image.info["parameters"])
    assert recipe.request.loras == (LoraSpec(fixtures["peft"], 0.5),)
    assert (recipe.request.seed, recipe.request.steps, recipe.request.scheduler) == (3, 1, "Euler")
    # The hash A1111 writes: sha256 of the file after its header (kohya's addnet hash), 12 hex digits.
    assert recipe.hashes[fixtures["peft"]] == made.adapters[0].hash and len(made.adapters[0].hash) == 12
