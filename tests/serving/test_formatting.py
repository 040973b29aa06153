"""The UI's pure helpers: size presets, base choices, trigger insertion, input parsing, cards and snippets."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.errors import InvalidRequestError
from engine.requests import AdapterUse, CheckedRequest, GenerateResult, LoraSpec, ModelDefaults, Timings
from lora_catalog.entries import Family, LoraEntry
from serving.ui import formatting as fmt
from serving.ui.snippets import api_snippets, base_url

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"


def test_size_presets_are_the_served_models_own():
    # The family's presets travel in the defaults (engine.families: tests/engine/families/test_registry.py).
    defaults = ModelDefaults(steps=25, guidance=5.0, side=1024, max_side=1536, sizes=((1024, 1024), (1216, 832)))
    assert fmt.size_presets(defaults) == [("1024 × 1024", "1024x1024"), ("1216 × 832", "1216x832")]
    # Defaults without presets (an older peer's): the square of the default side.
    assert fmt.size_presets(ModelDefaults(steps=25, guidance=7.5, side=768, max_side=1536)) == [
        ("768 × 768", "768x768")
    ]


def test_parse_size_names_the_bad_value():
    assert fmt.parse_size("832x1216") == (832, 1216)
    with pytest.raises(InvalidRequestError, match="size 'big' is not accepted"):
        fmt.parse_size("big")


def test_base_choices_put_the_served_base_and_its_family_first():
    from engine.outcomes import ServedPool
    from engine.requests import ModelDefaults
    from serving.ui.pool_views import base_choices

    defaults = ModelDefaults(steps=25, guidance=5.0, side=1024, max_side=1536)
    choices = base_choices((ServedPool(SDXL, SDXL, "sdxl", defaults, True),))
    assert choices[0] == ("SDXL 1.0 (served)", SDXL)
    browse_only = [label.endswith("(not served here)") for label, _ in choices]
    assert browse_only == sorted(browse_only)
    assert ("FLUX.1 [dev] (not served here)", "black-forest-labs/FLUX.1-dev") in choices
    assert ("SDXL Turbo (runs on SDXL 1.0)", "stabilityai/sdxl-turbo") in choices
    # Civitai's SDXL-shaped ecosystems (most of its SDXL LoRAs), as its routing runs them: on the SDXL pool.
    for label, repo_id in (
        ("Pony Diffusion V6 XL", "AstraliteHeart/pony-diffusion-v6"),
        ("Illustrious XL", "OnomaAIResearch/Illustrious-xl-early-release-v0"),
        ("NoobAI XL", "Laxhar/noobai-XL-1.1"),
    ):
        assert (f"{label} (runs on SDXL 1.0)", repo_id) in choices
    mine = base_choices((ServedPool("me/my-sdxl", "me/my-sdxl", "sdxl", defaults, True),))
    assert mine[0] == ("me/my-sdxl (served)", "me/my-sdxl")


@pytest.mark.parametrize(
    ("prompt", "old", "new", "expected"),
    [
        ("", None, "ohwx", "ohwx"),
        ("a cat", None, "ohwx", "ohwx, a cat"),
        ("ohwx, a cat", "ohwx", "sks style", "sks style, a cat"),
        ("a cat in sks style", None, "sks style", "a cat in sks style"),
        ("ohwx, a cat", "ohwx", None, "a cat"),
        ("a cat", "ohwx", "tok", "tok, a cat"),
    ],
)
def test_insert_trigger_puts_the_trigger_in_front_once(prompt, old, new, expected):
    assert fmt.insert_trigger(prompt, old, new) == expected


def test_form_fields_become_specs_and_seeds():
    assert fmt.lora_spec("  ", 1.0) is None
    assert fmt.lora_spec(" a/b ", 0.5, " v1 ", "") == LoraSpec("a/b", 0.5, revision="v1", weight_name=None)
    assert fmt.lora_spec("a/b", None) == LoraSpec("a/b", 1.0)
    assert fmt.seed_value(-1) is None
    assert fmt.seed_value(7, randomize=True) is None
    assert fmt.seed_value(7) == 7
    # Anything else goes to the engine as given, so its message names the bad value.
    assert fmt.seed_value(7.5) == 7.5
    assert fmt.seed_value(True) is True


def test_entry_card_shows_link_licence_badge_and_triggers():
    entry = LoraEntry(
        ref="alice/ink",
        repo_id="alice/ink",
        title="Ink <b>",
        family=Family.SDXL,
        trigger_words=("inkstyle",),
        license="cc-by-nc-4.0",
        non_commercial=True,
        downloads=1234,
        last_modified=datetime(2024, 1, 1, tzinfo=UTC),
    )
    card = fmt.entry_card(entry, "https://hub.example/")
    assert 'href="https://hub.example/alice/ink"' in card
    assert "Ink &lt;b&gt;" in card
    assert 'class="badge nc">non-commercial' in card
    assert '<span class="chip">inkstyle</span>' in card
    assert "1,234" in card


def test_a_video_loras_card_plays_its_preview_video_and_its_tile_stays_a_still():
    video = "https://hub.example/alice/fox/resolve/main/fox.mp4"
    entry = LoraEntry(ref="alice/fox", repo_id="alice/fox", title="Fox", family=Family.WAN, preview_videos=(video,))
    card = fmt.entry_card(entry, "https://hub.example/")
    assert f'<video class="lora-video" src="{video}" muted loop autoplay playsinline' in card
    # An attribute-breaking URL (a snapshot is only a file) stays inside its attribute.
    odd = fmt.entry_card(LoraEntry(ref="a/b", repo_id="a/b", title="x", preview_videos=('x" onerror="y',)), "h")
    assert 'src="x&quot; onerror=&quot;y"' in odd
    assert "<video" not in fmt.entry_card(LoraEntry(ref="a/b", repo_id="a/b", title="x"), "h")


def test_result_html_and_info_describe_timings_and_cache():
    request = CheckedRequest(
        "a cat",
        loras=(LoraSpec("a/b"),),
        steps=4,
        guidance=5.0,
        width=64,
        height=64,
        seed=9,
        sampler="LCM",
        scheduler="LCMScheduler",
        clip_skip=1,
        defaults_from=(("steps", "speed LoRA a/b (LCM)"),),
    )
    result = GenerateResult(
        image=None,  # type: ignore[arg-type]
        seed=9,
        request=request,
        timings=Timings(resolve=0.5, prepare=0.25, apply=0.002, inference=1.5, total=2.3),
        adapters=(AdapterUse("a/b", "abc", "w.safetensors", 1.0, "miss"),),
        warnings=("careful",),
    )
    text = fmt.result_html(result)
    for part in ("<code>9</code>", "download / resolve", "500 ms", "2 ms", "1.50 s", "2.30 s", "miss", "⚠ careful"):
        assert part in text
    assert "LCM · guidance 5 · CLIP skip 2" in text
    assert "<li>steps: speed LoRA a/b (LCM)</li>" in text
    info = fmt.result_info(result)
    assert info["seed"] == 9
    assert (info["sampler"], info["scheduler"], info["clip_skip"]) == ("LCM", "LCMScheduler", 1)
    assert info["defaults_from"] == {"steps": "speed LoRA a/b (LCM)"}
    assert info["loras"][0]["cache"] == "miss"
    assert info["timings"]["inference"] == 1.5


def test_result_html_shows_a_loras_window_as_a_comparisons_caption_does():
    """A LoRA active on part of the steps (issue 51): the info line says its window, not the scale of step 0 alone
    (which is 0 for a window from half the steps); a LoRA on every step shows its scale as before."""
    request = CheckedRequest(
        "a cat",
        loras=(
            LoraSpec("a/late", 0.0, schedule=((0.0, 0.0), (0.5, 0.8))),
            LoraSpec("a/early", 1.0, schedule=((0.0, 1.0), (0.25, 0.0))),
            LoraSpec("a/plain", 0.6),
        ),
        steps=4,
        guidance=5.0,
        width=64,
        height=64,
        seed=9,
    )
    uses = tuple(AdapterUse(s.ref, "abc", "w.safetensors", s.scale, "hit") for s in request.loras)
    result = GenerateResult(image=None, seed=9, request=request, timings=Timings(), adapters=uses)  # type: ignore[arg-type]
    text = fmt.result_html(result)
    assert "<code>a/late</code> × 0.8 from 0.5 to 1 — cache" in text
    assert "<code>a/early</code> × 1 from 0 to 0.25 — cache" in text
    assert "<code>a/plain</code> × 0.6 — cache" in text


def test_snippets_use_the_url_clients_reach():
    assert base_url({"host": "localhost:8888"}) == "http://localhost:8888/"
    assert base_url({"host": "me-space.hf.space"}) == "https://me-space.hf.space/"
    assert base_url({"host": "10.0.0.2", "x-forwarded-host": "a.b", "x-forwarded-proto": "https"}) == "https://a.b/"
    text = api_snippets("http://localhost:8888/", "alice/ink", ModelDefaults(25, 5.0, 1024, 1536))
    assert 'Client("http://localhost:8888/")' in text
    assert "curl -H 'lora: alice/ink' http://localhost:8888/" in text
    assert 'api_name="/generate"' in text
    assert '"num_inference_steps": 25' in text


def test_the_placeholder_is_a_neutral_square():
    image = fmt.placeholder_image(128)
    assert image.size == (128, 128)
    assert image.getpixel((0, 0)) == (229, 231, 235)
