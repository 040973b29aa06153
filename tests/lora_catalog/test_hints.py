"""A LoRA's recommended settings: speed LoRAs recognised, cards' widget defaults read, files' metadata, blends."""

from __future__ import annotations

import pytest

from lora_catalog.cards import entry_from_hub_item
from lora_catalog.entries import LoraEntry
from lora_catalog.hints import (
    SPEED_PRESETS,
    LoraHints,
    blend_hints,
    card_hints,
    civitai_hints,
    metadata_hints,
    speed_hints,
)


@pytest.mark.parametrize(
    ("repo_id", "names", "kind", "steps", "guidance", "sampler"),
    [
        ("latent-consistency/lcm-lora-sdxl", (), "LCM", 4, 1.0, "LCM"),
        ("ByteDance/SDXL-Lightning", ("sdxl_lightning_8step_lora.safetensors",), "Lightning", 8, 0.0, "Euler trailing"),
        ("ByteDance/Hyper-SD", ("Hyper-SDXL-8steps-CFG-lora.safetensors",), "Hyper-SD", 8, 5.0, "DDIM trailing"),
        ("ByteDance/Hyper-SD", ("Hyper-SD15-4steps-lora.safetensors",), "Hyper-SD", 4, 0.0, "DDIM trailing"),
        ("tianweiy/DMD2", ("dmd2_sdxl_4step_lora.safetensors",), "DMD2", 4, 0.0, "LCM"),
        ("h1t/TCD-SDXL-LoRA", (), "TCD", 4, 0.0, "TCD"),
        ("someone/my-lcm-lora", (), "LCM", 4, 1.0, "LCM"),
        ("someone/style", ("sdxl-lightning-4steps.safetensors",), "Lightning", 4, 0.0, "Euler trailing"),
        ("someone/sd_xl_turbo_lora", (), "Turbo", 4, 0.0, "Euler a trailing"),
        ("someone/style", ("tcd",), "TCD", 4, 0.0, "TCD"),
        # lightx2v's Qwen-Image-Lightning: 8 steps unless its file says 4, no CFG, the flow-match Euler sampler.
        ("lightx2v/Qwen-Image-Lightning", (), "Qwen-Image-Lightning", 8, 1.0, "Euler flow"),
        (
            "lightx2v/Qwen-Image-Lightning",
            ("Qwen-Image-Lightning-4steps-V1.0.safetensors",),
            "Qwen-Image-Lightning",
            4,
            1.0,
            "Euler flow",
        ),
        (
            "someone/mirror",
            ("Qwen-Image-Lightning-8steps-V1.1.safetensors",),
            "Qwen-Image-Lightning",
            8,
            1.0,
            "Euler flow",
        ),
        (
            "someone/mirror",
            ("Qwen-Image-Edit-Lightning-4steps-V1.0.safetensors",),
            "Qwen-Image-Lightning",
            4,
            1.0,
            "Euler flow",
        ),
        # Krea 2 Turbo's distillation as a LoRA for Raw, by its repo or file name: Turbo's 8 steps without CFG.
        ("someone/Krea-2-Turbo-LoRA", (), "Krea 2 Turbo", 8, 0.0, "Euler flow"),
        ("someone/style", ("krea2_turbo_8steps_lora.safetensors",), "Krea 2 Turbo", 8, 0.0, "Euler flow"),
    ],
)
def test_speed_loras_are_recognised_with_their_own_settings(repo_id, names, kind, steps, guidance, sampler):
    hints = speed_hints([repo_id, *names], repo_id=repo_id)
    assert (hints.speed, hints.steps, hints.guidance, hints.sampler) == (kind, steps, guidance, sampler)
    assert kind in hints.source("sampler")  # type: ignore[operator]


@pytest.mark.parametrize(
    "name",
    [
        "someone/lightning-bolt-style",
        "someone/turbo-car",
        "someone/clcm-art",
        "someone/hyperrealism",
        "x/y",
        # A LoRA made on Krea 2 Turbo (its card's tag), no speed LoRA.
        "base_model:adapter:krea/Krea-2-Turbo",
        "someone/krea-2-turbo-portraits",
    ],
)
def test_a_style_lora_that_only_sounds_fast_is_no_speed_lora(name):
    assert speed_hints([name], repo_id=name).empty


def test_card_widget_defaults_are_read_and_checked():
    card = {
        "inference": {"parameters": {"num_inference_steps": 30, "guidance_scale": 7, "negative_prompt": "blurry"}},
        "widget": [{"text": "a"}, {"text": "b", "parameters": {"num_inference_steps": 12, "clip_skip": 1}}],
    }
    hints = card_hints(card)
    assert (hints.steps, hints.guidance, hints.negative_prompt, hints.clip_skip) == (30, 7.0, "blurry", 1)
    assert hints.source("steps") == "the card (inference parameters)"
    assert hints.source("clip_skip") == "the card (widget example)"
    # Hand-written cards: wrong types and silly values are left out, not guessed.
    messy = {"inference": {"parameters": {"num_inference_steps": "30", "guidance_scale": True, "clip_skip": 2.5}}}
    assert card_hints(messy).empty
    assert card_hints({"inference": "yes", "widget": "no"}).empty
    assert card_hints({"inference": {"parameters": {"num_inference_steps": 9999}}}).empty


def test_on_a_sibling_checkpoint_a_cards_steps_and_guidance_are_left_out_and_a_speed_loras_kept():
    card = {"widget": [{"parameters": {"num_inference_steps": 28, "guidance_scale": 4.5, "negative_prompt": "x"}}]}
    sibling = card_hints(card).for_a_sibling()
    assert (sibling.steps, sibling.guidance, sibling.negative_prompt) == (None, None, "x")
    assert sibling.source("steps") is None and sibling.source("negative_prompt") == "the card (widget example)"
    speed = speed_hints(["krea2_turbo_8steps_lora"])
    assert speed.for_a_sibling() == speed and (speed.steps, speed.guidance) == (8, 0.0)


def test_a_kohya_file_says_the_clip_skip_it_was_trained_with():
    hints = metadata_hints({"ss_clip_skip": "2", "ss_output_name": "anime_style"})
    assert (hints.clip_skip, hints.speed) == (1, None)
    assert "ss_clip_skip=2" in (hints.source("clip_skip") or "")
    assert metadata_hints({"ss_clip_skip": "None"}).empty
    assert metadata_hints({"ss_clip_skip": "1"}).empty
    assert metadata_hints({"modelspec.title": "Hyper-SD 8steps"}).speed == "Hyper-SD"


def test_a_civitai_pages_clip_skip_in_a1111s_count_and_a_speed_loras_name():
    hints = civitai_hints(2, ("Anime lineart", "v2.0"))
    assert (hints.clip_skip, hints.speed, hints.source("clip_skip")) == (1, None, "its Civitai page (clipSkip 2)")
    assert civitai_hints(1).empty and civitai_hints(None).empty
    fast = civitai_hints(None, ("Hyper-SD 8steps", "v1"))
    assert (fast.speed, fast.steps, fast.sampler) == ("Hyper-SD", 8, SPEED_PRESETS["Hyper-SD"].sampler)
    assert metadata_hints({}, ("lcm_lora.safetensors",)).speed == "LCM"


def test_a_blend_takes_the_speed_loras_settings_then_each_in_order():
    style = LoraHints(steps=30, guidance=7.0, clip_skip=1, sources=(("steps", "style"), ("guidance", "style"),
                                                                    ("clip_skip", "style")))  # fmt: skip
    lcm = speed_hints(["latent-consistency/lcm-lora-sdxl"], repo_id="latent-consistency/lcm-lora-sdxl")
    blended = blend_hints([style, lcm])
    assert (blended.speed, blended.steps, blended.guidance, blended.sampler) == ("LCM", 4, 1.0, "LCM")
    # What the speed LoRA does not say comes from the style LoRA.
    assert blended.clip_skip == 1 and blended.source("clip_skip") == "style"
    assert blend_hints([style]).steps == 30
    assert blend_hints([]).empty


def test_hints_travel_in_a_catalogue_entry_and_back():
    item = {
        "id": "latent-consistency/lcm-lora-sdxl",
        "tags": ["lora", "base_model:adapter:stabilityai/stable-diffusion-xl-base-1.0"],
        "siblings": [{"rfilename": "pytorch_lora_weights.safetensors"}],
        "cardData": {"inference": {"parameters": {"num_inference_steps": 6}}},
    }
    entry = entry_from_hub_item(item, endpoint="https://huggingface.co")
    # The card's own number before the speed kind's generic one; the rest from the kind.
    assert (entry.hints.speed, entry.hints.steps, entry.hints.sampler) == ("LCM", 6, "LCM")
    assert entry.hints.source("steps") == "the card (inference parameters)"
    back = LoraEntry.from_json(entry.to_json())
    assert back.hints == entry.hints
    assert LoraEntry.from_json({"ref": "a/b", "hints": "garbage"}).hints.empty


def test_every_preset_is_a_sampler_the_engine_knows():
    from engine.samplers import find_sampler

    named = [preset.sampler for preset in SPEED_PRESETS.values() if preset.sampler is not None]
    assert all(find_sampler(sampler) is not None for sampler in named)


@pytest.mark.parametrize(
    ("repo_id", "names", "kind"),
    [
        # lightx2v's step- and CFG-distilled Wan 2.1 LoRAs, in its repos and as Kijai republished them.
        ("lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill-Lightx2v", (), "Wan-Lightx2v"),
        ("Kijai/WanVideo_comfy", ("Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors",), "Wan-Lightx2v"),
        (
            "Kijai/WanVideo_comfy",
            ("Lightx2v/lightx2v_I2V_14B_480p_cfg_step_distill_rank128_bf16.safetensors",),
            "Wan-Lightx2v",
        ),
        ("someone/mirror", ("Wan21_I2V_14B_lightx2v_cfg_step_distill_lora_rank64.safetensors",), "Wan-Lightx2v"),
        ("lightx2v/Wan2.1-Distill-Loras", ("wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors",), "Wan-Lightx2v"),
        ("someone/mirror", ("wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors",), "Wan-Lightx2v"),
        # Wan2.2-Lightning's A14B pairs: the repo, and Kijai's file names.
        ("lightx2v/Wan2.2-Lightning", ("Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1/",), "Wan2.2-Lightning"),
        ("someone/mirror", ("Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16.safetensors",), "Wan2.2-Lightning"),
    ],
)
def test_wan_speed_loras_bring_4_steps_and_no_cfg_with_the_pools_own_sampler(repo_id, names, kind):
    hints = speed_hints([repo_id, *names], repo_id=repo_id)
    assert (hints.speed, hints.steps, hints.guidance, hints.sampler) == (kind, 4, 1.0, None)
    assert kind in hints.source("guidance")  # type: ignore[operator]


@pytest.mark.parametrize(
    "name", ["lightx2v_style.safetensors", "wan22_lightning_bolt_style.safetensors", "wan_x.safetensors"]
)
def test_a_wan_lora_that_only_mentions_lightx2v_or_lightning_is_no_speed_lora(name):
    assert speed_hints([name]).speed is None
