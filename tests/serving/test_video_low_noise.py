"""Each LoRA's low-noise scale (`LoraSpec.scale_2`) at the UI, without a browser: the "Low-noise scale" controls
show only for a two-stage pool's base (Wan 2.2 A14B), reach only such a pool's request, and a result made there
keeps them in its history entry and share link ("use these settings again" puts them back) and in its recipe.
Both doors' bytes on the tiny two-stage pool: test_video_doors_i2v.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

import gradio as gr

from engine.normalise import normalise_request
from engine.outcomes import ServedPool
from engine.requests import AdapterUse, GenerateRequest, Limits, LoraSpec, ModelDefaults
from serving import recipes
from serving.ui import history, session
from serving.ui.video_ui import (
    follow_scale,
    low_noise_control,
    low_noise_shown,
    video_controls,
    video_request,
    wire_video,
)
from tests.support.video import video_result

_SIDES = {"steps": 4, "guidance": 5.0, "side": 64, "max_side": 128}
TWO_STAGE = ModelDefaults(**_SIDES, video=True, num_frames=9, fps=16, max_frames=17, guidance_2=3.0)  # type: ignore[arg-type]
ONE_STAGE = dataclasses.replace(TWO_STAGE, guidance_2=None)
IMAGE = ModelDefaults(**_SIDES)  # type: ignore[arg-type]
POOLS = (
    ServedPool("owner/image-base", "owner/image-base", "sdxl", IMAGE, True),
    ServedPool("owner/wan21", "owner/wan21", "wan", ONE_STAGE, False),
    ServedPool("owner/wan22", "owner/wan22", "wan22", TWO_STAGE, False),
)
HANDLERS = SimpleNamespace(pools=POOLS, default=POOLS[0])
LORA, LORA_2 = "owner/wan-style", "owner/wan-motion"


def test_the_low_noise_scales_show_only_for_a_two_stage_pools_base():
    bases = [pool.base_model_id for pool in POOLS]
    shown = {base: [s.visible for s in low_noise_shown(HANDLERS, base)] for base in bases}  # type: ignore[arg-type]
    assert shown == {"owner/image-base": [False, False], "owner/wan21": [False, False], "owner/wan22": [True, True]}
    # A base no pool serves changes nothing.
    assert all(isinstance(s, type(gr.skip())) for s in low_noise_shown(HANDLERS, "owner/none"))  # type: ignore[arg-type]
    with gr.Blocks():
        control = low_noise_control(1, False)
        shown_control = low_noise_control(2, True)
    assert control.visible is False and shown_control.visible is True
    assert control.label == "Low-noise scale" and shown_control.elem_id == "lora-2-scale-2"


def test_the_forms_low_noise_scales_reach_only_a_two_stage_pools_request():
    request = GenerateRequest(prompt="a fox", loras=(LoraSpec(LORA, 0.8), LoraSpec(LORA_2, 0.6)))
    lows = ((LORA, 0.3), (LORA_2, 1.0))
    on_two = video_request(HANDLERS, request, "owner/wan22", 9, 16, lows)  # type: ignore[arg-type]
    assert [(s.ref, s.scale, s.scale_2) for s in on_two.loras] == [(LORA, 0.8, 0.3), (LORA_2, 0.6, 1.0)]
    on_one = video_request(HANDLERS, request, "owner/wan21", 9, 16, lows)  # type: ignore[arg-type]
    assert [s.scale_2 for s in on_one.loras] == [None, None]
    assert video_request(HANDLERS, request, "owner/image-base", 9, 16, lows) is request  # type: ignore[arg-type]
    # An empty first slot: the second LoRA is the request's only one and takes the second slot's scale.
    alone = GenerateRequest(prompt="a fox", loras=(LoraSpec(LORA_2, 0.6),))
    moved = video_request(HANDLERS, alone, "owner/wan22", 9, 16, (("", 0.3), (LORA_2, 0.2)))  # type: ignore[arg-type]
    assert [(s.ref, s.scale_2) for s in moved.loras] == [(LORA_2, 0.2)]


def test_the_low_noise_scale_follows_its_loras_scale_until_the_user_moves_it():
    """The docs: without a low-noise scale of its own, `scale` applies to both. The slider started at 1 whatever the
    LoRA's scale, so a LoRA at 0.5 ran 0.5 high-noise and 1 low-noise; it now shows the LoRA's scale (and the
    request carries one) until the user moves it, then keeps the user's."""
    with gr.Blocks() as demo:
        base = gr.Dropdown(["owner/wan22"], value="owner/wan22")
        controls = video_controls(TWO_STAGE)
        scale, low, moved = gr.Slider(-2, 2, value=1.0), low_noise_control(1, True), gr.State(False)
        wire_video(HANDLERS, base, controls, (gr.Video(), gr.Image()), gr.State(None), [(scale, low, moved)])  # type: ignore[arg-type]
    (follow,) = [fn for fn in demo.fns.values() if fn.fn is follow_scale]
    assert follow.targets == [(scale._id, "change")]
    assert [c._id for c in follow.inputs] == [scale._id, moved._id] and [c._id for c in follow.outputs] == [low._id]
    # Only the user's own move of the low-noise scale (`input`, which this follow does not fire) marks it moved.
    (mark,) = [fn for fn in demo.fns.values() if [c._id for c in fn.outputs] == [moved._id]]
    assert mark.targets == [(low._id, "input")] and mark.fn is not None and mark.fn() is True
    # A LoRA set to 0.5: the low-noise scale shows 0.5, and what the form sends runs 0.5 on both transformers.
    shown = follow_scale(0.5, False)
    request = GenerateRequest(prompt="a fox", loras=(LoraSpec(LORA, 0.5),))
    sent = video_request(HANDLERS, request, "owner/wan22", 9, 16, ((LORA, shown.value), ("", 1.0)))  # type: ignore[arg-type]
    checked = normalise_request(sent, TWO_STAGE, Limits(max_loras=2, max_steps=10, max_prompt_chars=100))
    assert [(s.scale, s.scale_2) for s in checked.loras] == [(0.5, None)]
    # Once moved, it stays where the user put it.
    assert isinstance(follow_scale(0.7, True), type(gr.skip()))


def test_a_links_low_noise_scale_off_its_loras_scale_is_kept_and_one_equal_to_it_follows():
    assert session.low_noise_moved({"lora_scale": "0.8", "lora_scale_2": "1"}) == (True, False)
    assert session.low_noise_moved({"lora_scale": "0.8", "lora_scale_2": "0.8", "lora_2_scale_2": "0.3"}) == (
        False,
        True,
    )
    # A link leaves a scale of 1 out; no low-noise scale (a one-stage pool's link) follows.
    assert session.low_noise_moved({"lora_2_scale_2": "1"}) == (False, False)
    assert session.low_noise_moved({"lora_scale": "0.5"}) == (False, False)


FORM = {
    **dict.fromkeys(history.FORM),
    "prompt": "a fox",
    "negative": "",
    "lora": LORA,
    "lora_scale": 0.8,
    "lora_2": "",
    "size": "64x48",
    "steps": 2,
    "guidance": 5.0,
    "sampler": "",
    "images": 1,
    "clip_skip": 1,
    "base": "owner/wan22",
    "history": [],
    "lora_scale_2": 1.0,
    "lora_2_scale_2": 0.4,
}


def _filled(query: dict[str, str], defaults: ModelDefaults) -> dict[str, object]:
    return dict(zip((*session.FIELDS, "randomize"), session.form_values(query, defaults, 60), strict=True))


def test_a_two_stage_results_link_and_history_keep_its_low_noise_scales():
    made = video_result(GenerateRequest(prompt="a fox", num_frames=5, loras=(LoraSpec(LORA, 0.8, scale_2=1.0),)))
    two_stage = dataclasses.replace(made, request=dataclasses.replace(made.request, guidance_2=3.0))
    link, _, entries = history.remember(FORM, two_stage, "https://space.example/")
    query = dict(parse_qsl(urlsplit(link).query))
    # 1.0 is kept (it differs from the high-noise 0.8); the empty second slot's is not.
    assert query["lora_scale_2"] == "1" and "lora_2_scale_2" not in query
    assert entries[0]["params"] == query
    filled = _filled(query, TWO_STAGE)
    assert (filled["lora_scale"], filled["lora_scale_2"]) == (0.8, 1.0)
    # A one-stage result's link carries none: the form keeps what it has.
    link, _, _ = history.remember(FORM, made, "https://space.example/")
    assert not {"lora_scale_2", "lora_2_scale_2"} & dict(parse_qsl(urlsplit(link).query)).keys()
    assert isinstance(_filled({"lora_scale_2": "9"}, TWO_STAGE)["lora_scale_2"], type(gr.skip()))


def test_the_recipe_carries_each_loras_low_noise_scale_and_reads_it_back():
    made = video_result(GenerateRequest(prompt="a fox", num_frames=5, loras=(LoraSpec(LORA, 0.8, scale_2=0.5),)))
    uses = (
        AdapterUse(LORA, "main", "pytorch_lora_weights.safetensors", 0.8, "hit", scale_2=0.5),
        AdapterUse(LORA_2, "main", "motion.safetensors", 0.6, "hit"),
    )
    text = recipes.recipe_text(dataclasses.replace(made, adapters=uses))
    assert f"<lora:{LORA}:0.8>" in text and f"<lora:{LORA_2}/motion.safetensors:0.6>" in text
    assert f'Lora scales 2: "{LORA}: 0.5"' in text
    read = recipes.parse_recipe(text).request.loras
    assert [(s.ref, s.scale, s.scale_2) for s in read] == [(LORA, 0.8, 0.5), (LORA_2, 0.6, None)]
    # One stage (no low-noise scale differs): the recipe has no such parameter.
    assert recipes.SCALES_2 not in recipes.recipe_text(dataclasses.replace(made, adapters=uses[1:]))
