"""The UI's session pieces without a browser: share links, the form they fill, the LoRAs' recommended settings."""

from __future__ import annotations

import dataclasses
import hashlib
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
from PIL import Image

from engine.images import DEFAULT_MAX_INPUT_PIXELS as PIXELS
from engine.request_fields import DECLARED_FIELDS
from engine.requests import CheckedRequest, GenerateResult, InputImage, LoraSpec, ModelDefaults, Timings
from engine.video_input import InputVideo
from lora_catalog.hints import LoraHints, speed_hints
from serving.recipes import parse_recipe, recipe_text
from serving.ui import session
from serving.ui.history import FORM, remember, request_of

DEFAULTS = ModelDefaults(
    steps=25,
    guidance=5.0,
    side=1024,
    max_side=1536,
    sizes=((1024, 1024), (1152, 896)),
    scheduler="EulerDiscreteScheduler",
    schedulers=("EulerAncestralDiscreteScheduler", "EulerDiscreteScheduler", "LCMScheduler"),
    max_clip_skip=10,
)
FORM_VALUES = {
    "prompt": "a fox, in a forest & more",
    "negative": "",
    "lora": "owner/style",
    "lora_scale": 0.8,
    "lora_revision": "",
    "lora_weight": "",
    "lora_2": "latent-consistency/lcm-lora-sdxl",
    "lora_2_scale": 1.0,
    "lora_2_revision": "",
    "lora_2_weight": "",
    "size": "1152x896",
    "steps": 4,
    "guidance": 1.0,
    "sampler": "Euler a",
    "clip_skip": 2,
    "images": 2,
    "recommended": True,
    "seed": 42,
    "randomize": True,
    "source": None,
    "strength": 0.6,
    "base": "",
    "history": [],
}


def test_a_share_link_fills_the_form_it_was_made_from():
    params = session.share_params(FORM_VALUES)
    url = session.share_url("https://me-space.hf.space/", params)
    query = dict(parse_qsl(urlsplit(url).query))
    assert query["prompt"] == "a fox, in a forest & more"
    assert "lora_2_scale" not in query and "negative" not in query, "defaults and empty fields stay out"
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, DEFAULTS, 60), strict=True))
    for name in ("prompt", "lora", "lora_scale", "size", "steps", "guidance", "sampler", "clip_skip", "seed"):
        assert filled[name] == FORM_VALUES[name], name
    assert filled["images"] == 2
    # A link with a seed makes that image: the seed is not drawn again.
    assert filled["randomize"] is False


def test_what_the_form_cannot_show_is_left_as_it_is():
    odd = {"size": "999x999", "steps": "500", "sampler": "Restart", "clip_skip": "40", "seed": "-3", "lora_scale": "x"}
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(odd, DEFAULTS, 60), strict=True))
    skip = gr.skip()
    assert all(filled[name] == skip for name in odd)
    assert filled["randomize"] == skip


def test_the_form_asks_for_what_it_shows_leaving_defaults_to_the_loras_when_the_switch_is_on():
    form = {**FORM_VALUES, "sampler": "", "clip_skip": 1}
    on = request_of(form, PIXELS)
    assert (on.scheduler, on.clip_skip, on.lora_defaults, on.num_images) == (None, None, True, 2)
    assert on.loras == (LoraSpec("owner/style", 0.8), LoraSpec("latent-consistency/lcm-lora-sdxl", 1.0))
    off = request_of({**form, "recommended": False}, PIXELS)
    assert (off.scheduler, off.clip_skip, off.lora_defaults) == (None, 0, False)
    chosen = request_of(FORM_VALUES, PIXELS)
    assert (chosen.scheduler, chosen.clip_skip) == ("Euler a", 1)
    assert set(FORM) == {*FORM_VALUES}
    # No input image: text-to-image, where the strength slider does not apply.
    assert (chosen.image, chosen.mask_image, chosen.strength) == (None, None, None)


def test_the_recommended_settings_say_where_they_come_from():
    style = LoraHints(clip_skip=1, sources=(("clip_skip", "its training metadata (ss_clip_skip=2)"),))
    lcm = speed_hints(["latent-consistency/lcm-lora-sdxl"], repo_id="latent-consistency/lcm-lora-sdxl")
    steps, guidance, sampler, clip_skip, note = session.recommended([style, lcm], DEFAULTS, 60, True)
    assert (steps, guidance, sampler, clip_skip) == (4, 1.0, "LCM", 2)
    assert note.startswith("**LCM speed LoRA**: its own settings. Recommended by the LoRA: steps 4, guidance 1, ")
    assert "CLIP skip 2 — its training metadata (ss_clip_skip=2)" in note
    assert session.recommended([style, lcm], DEFAULTS, 60, False) == (
        25,
        5.0,
        "",
        1,
        "The LoRA's recommended settings are off: the model's defaults.",
    )
    # A sampler the pool does not offer stays the default, and is not claimed in the note.
    tcd = speed_hints(["h1t/TCD-SDXL-LoRA"], repo_id="h1t/TCD-SDXL-LoRA")
    _, _, sampler, _, note = session.recommended([tcd], DEFAULTS, 60, True)
    assert sampler == "" and "sampler" not in note


def test_the_form_with_an_input_image_asks_for_image_to_image_at_its_strength(tmp_path):
    # The editor hands over its files' paths (`type="filepath"`).
    path = tmp_path / "background.png"
    Image.new("RGBA", (64, 48), (10, 20, 30, 255)).save(path)
    source = {"background": str(path), "layers": [], "composite": None}
    request = request_of({**FORM_VALUES, "source": source}, PIXELS)
    assert request.image == InputImage.from_pil(Image.new("RGB", (64, 48), (10, 20, 30)))
    assert (request.mask_image, request.strength, request.mode) == (None, 0.6, "image-to-image")


def test_a_share_link_says_its_result_started_from_an_input_image_it_cannot_carry():
    image = InputImage.from_pil(Image.new("RGB", (64, 64), (200, 10, 10)))
    checked = CheckedRequest(prompt="a fox", steps=10, width=64, height=64, seed=5, image=image, strength=0.6)
    made = GenerateResult(image=Image.new("RGB", (64, 64)), seed=5, request=checked, timings=Timings())
    link, _, entries = remember({**FORM_VALUES, "source": {"background": image.to_pil()}}, made, "https://s.hf.space")
    query = dict(parse_qsl(urlsplit(link).query))
    assert (query["input"], query["strength"]) == ("image-to-image", "0.6")
    assert "image-to-image" in entries[0]["caption"]
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, DEFAULTS, 60), strict=True))
    assert filled["strength"] == 0.6
    assert "input image (image-to-image), which a link or the history cannot carry" in filled["input"]
    # A text-to-image result's link says nothing of an input.
    plain = dataclasses.replace(made, request=dataclasses.replace(checked, image=None, strength=None))
    text_link, _, _ = remember(FORM_VALUES, plain, "https://s.hf.space")
    assert "input=" not in text_link and "strength=" not in text_link
    # Put back, it empties the note an earlier image-to-image result's link left.
    assert session.form_values({"seed": "5"}, DEFAULTS, 60)[session.FIELDS.index("input")] == ""


def test_a_share_link_names_the_reference_video_it_cannot_carry():
    frame = InputImage.from_pil(Image.new("RGB", (64, 64), (9, 9, 9)))
    video = InputVideo((frame,) * 9, 24.0, b"the client's mp4")
    checked = CheckedRequest(prompt="a fox", steps=2, width=64, height=64, seed=5, num_frames=9, fps=24)
    made = GenerateResult(image=frame.to_pil(), seed=5, request=checked, timings=Timings(), frames=(frame.to_pil(),))
    ic = dataclasses.replace(made, request=dataclasses.replace(checked, reference_video=video))
    link, _, _ = remember(FORM_VALUES, ic, "https://s.hf.space")
    query = dict(parse_qsl(urlsplit(link).query))
    # The file's SHA-256, as the recipe's "Reference video" names it.
    digest = hashlib.sha256(b"the client's mp4").hexdigest()
    assert query["reference_video"] == digest == parse_recipe(recipe_text(ic)).reference_video.sha256  # type: ignore[union-attr]
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, DEFAULTS, 60), strict=True))
    assert f"a reference video (an IC-LoRA's; the file's SHA-256 `{digest}`), which a link" in filled["input"]
    # A video without one: nothing said; a link's value of another form is not repeated.
    plain_link, _, _ = remember(FORM_VALUES, made, "https://s.hf.space")
    assert "reference_video=" not in plain_link
    odd = session.form_values({"seed": "5", "reference_video": "<b>x</b>"}, DEFAULTS, 60)
    assert odd[session.FIELDS.index("input")] == gr.skip()


def test_a_share_link_and_history_entry_keep_the_reference_videos_settings_and_put_them_back():
    """An IC-LoRA run's `reference_strength` / `reference_downscale` (the checked request's, as the recipe names
    them with the video) go in its link and history entry, and fill the boxes under the reference video's slot
    again; a run that left one at diffusers' default empties its box rather than keep an earlier run's."""
    in_context = dataclasses.replace(DEFAULTS, video=True, reference_video=True, num_frames=9, max_frames=17)
    frame = InputImage.from_pil(Image.new("RGB", (64, 64), (9, 9, 9)))
    video = InputVideo((frame,) * 9, 24.0, b"the client's mp4")
    checked = CheckedRequest(prompt="a fox", steps=2, width=64, height=64, seed=5, num_frames=9, fps=24)
    made = GenerateResult(image=frame.to_pil(), seed=5, request=checked, timings=Timings(), frames=(frame.to_pil(),))
    # Downscale 1 is a value the run set (unlike a LoRA's scale of 1, which a link leaves out).
    for strength, downscale in ((0.25, 2), (0.5, 1)):
        ran = dataclasses.replace(
            checked, reference_video=video, reference_strength=strength, reference_downscale=downscale
        )
        ic = dataclasses.replace(made, request=ran)
        link, _, entries = remember(FORM_VALUES, ic, "https://s.hf.space")
        query = dict(parse_qsl(urlsplit(link).query))
        assert (query["reference_strength"], query["reference_downscale"]) == (f"{strength:g}", str(downscale))
        assert entries[0]["params"] == query
        named = parse_recipe(recipe_text(ic)).reference_video
        assert named is not None and (named.strength, named.downscale) == (strength, downscale)
        filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, in_context, 60), strict=True))
        assert (filled["reference_strength"], filled["reference_downscale"]) == (strength, downscale)
        # An image pool's form has no such boxes: nothing is filled.
        on_image = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, DEFAULTS, 60), strict=True))
        assert on_image["reference_strength"] == on_image["reference_downscale"] == gr.skip()
    # A run at diffusers' defaults: neither in its link, and both boxes emptied (None) where it is put back.
    defaults_link, _, _ = remember(
        FORM_VALUES,
        dataclasses.replace(made, request=dataclasses.replace(checked, reference_video=video)),
        "https://s.hf.space",
    )
    query = dict(parse_qsl(urlsplit(defaults_link).query))
    assert not {"reference_strength", "reference_downscale"} & query.keys()
    filled = dict(zip((*session.FIELDS, "randomize"), session.form_values(query, in_context, 60), strict=True))
    assert (filled["reference_strength"], filled["reference_downscale"]) == (None, None)
    # A link without a reference video empties them too (its run sent neither); values the boxes cannot hold are
    # not put in.
    plain = dict(zip((*session.FIELDS, "randomize"), session.form_values({"seed": "5"}, in_context, 60), strict=True))
    assert (plain["reference_strength"], plain["reference_downscale"]) == (None, None)
    odd = {"reference_video": "ab" * 32, "reference_strength": "2", "reference_downscale": "9"}
    kept = dict(zip((*session.FIELDS, "randomize"), session.form_values(odd, in_context, 60), strict=True))
    assert kept["reference_strength"] == kept["reference_downscale"] == gr.skip()


def _carried() -> tuple[str, ...]:
    """The link parameters that stand for the request's declared fields: their Gradio arguments as a link names
    them, those the form shows (`session.FIELDS`)."""
    declared = DECLARED_FIELDS.values()
    arguments = (a for f in declared for a in (*f.gradio, *f.gradio_video, *f.gradio_late, *f.gradio_video_last))
    return tuple(dict.fromkeys(n for a in arguments if (n := session.LINK_NAMES.get(a, a)) in session.FIELDS))


def _put_back(form: dict, params: dict[str, str], defaults: ModelDefaults) -> dict:
    """The form after a link or a history entry is put back in it (`gr.skip()`: the field keeps its value)."""
    filled = zip((*session.FIELDS, "randomize"), session.form_values(params, defaults, 60), strict=True)
    return {**form, **{name: value for name, value in filled if value != gr.skip()}}


def test_use_again_puts_every_field_a_link_leaves_out_back_at_its_default():
    """Request A moves every declared field the link carries off its default, B leaves each at its default (so
    B's link, kept short, leaves most out). B's history entry put back in the form A left (or B's link opened in
    a page showing A's values) is B's form again, and asks for B's request: no field keeps A's value."""
    pool = dataclasses.replace(
        DEFAULTS, video=True, num_frames=9, max_frames=17, fps=16, guidance_2=3.0, reference_video=True, strength=0.7
    )
    form_b = {
        **FORM_VALUES,
        "prompt": "a heron",
        **dict.fromkeys(("lora", "lora_2"), ""),
        **dict.fromkeys(("lora_scale", "lora_2_scale", "lora_scale_2", "lora_2_scale_2"), 1.0),
        **{name: 0.0 if name.endswith("start") else 1.0 for name in session.WINDOWS},
        "size": "1024x1024",
        "steps": pool.steps,
        "guidance": pool.guidance,
        "sampler": "",
        "clip_skip": 1,
        "images": 1,
        "seed": 7,
        "randomize": False,
        "strength": pool.strength,
        "num_frames": pool.num_frames,
        "fps": pool.fps,
        "reference_strength": None,
        "reference_downscale": None,
    }
    form_a = {
        **FORM_VALUES,
        "negative": "blurry",
        "lora_2_scale": 0.5,
        "lora_scale_2": 0.3,
        "lora_2_scale_2": 0.4,
        **dict(zip(session.WINDOWS, (0.2, 0.8, 0.1, 0.9), strict=True)),
        "num_frames": 17,
        "fps": 24,
        "reference_strength": 0.25,
        "reference_downscale": 2,
    }
    carried = _carried()
    assert [name for name in carried if form_a[name] == form_b[name]] == [], "A sets each carried field apart"
    frame = InputImage.from_pil(Image.new("RGB", (64, 64), (9, 9, 9)))
    clip = InputVideo((frame,) * 9, 24.0, b"the client's mp4")
    ran_b = CheckedRequest(prompt="a fox", steps=25, width=64, height=64, seed=7, num_frames=9, fps=16, guidance_2=3.0)
    ran_a = dataclasses.replace(
        ran_b, seed=42, image=frame, strength=0.6, reference_video=clip, reference_strength=0.25, reference_downscale=2
    )
    links = []
    for form, ran in ((form_a, ran_a), (form_b, ran_b)):
        frames = (frame.to_pil(),) * (ran.num_frames or 1)
        made = GenerateResult(image=frame.to_pil(), seed=ran.seed, request=ran, timings=Timings(), frames=frames)
        link, _, entries = remember(form, made, "https://s.hf.space")
        links.append(dict(parse_qsl(urlsplit(link).query)))
        assert entries[0]["params"] == links[-1]
    link_a, link_b = links
    assert not {"negative", "lora", "sampler", "reference_strength", "lora_end"} & link_b.keys(), "a short link"
    again = _put_back(_put_back(form_b, link_a, pool), link_b, pool)
    assert {name: again[name] for name in carried} == {name: form_b[name] for name in carried}
    assert request_of(again, PIXELS) == request_of(form_b, PIXELS)
