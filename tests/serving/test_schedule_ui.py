"""Each LoRA's "active from … to …" range in the UI, without a browser: the form sends it as the request's
`start`/`end` (every step, 0 to 1, is the request it was before ranges), and a result's share link and history
entry carry it, so that "use these settings again" and a link opened put it back. The browser's walk through it:
tests/serving/test_browser_demo_tour.py."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from engine.normalise import normalise_loras
from engine.requests import GenerateRequest, LoraSpec, ModelDefaults
from serving.ui import history, session
from tests.support.video import video_result

LORA = "owner/sda"
DEFAULTS = ModelDefaults(steps=4, guidance=5.0, side=64, max_side=128)
FORM = {
    **dict.fromkeys(history.FORM),
    "prompt": "a fox",
    "negative": "",
    "lora": LORA,
    "lora_revision": "",
    "lora_weight": "",
    "lora_scale": 0.8,
    "lora_2": "",
    "lora_2_revision": "",
    "lora_2_weight": "",
    "lora_2_scale": 1.0,
    "size": "64x64",
    "steps": 4,
    "guidance": 5.0,
    "sampler": "",
    "images": 1,
    "clip_skip": 1,
    "recommended": True,
    "seed": 3,
    "randomize": False,
    "history": [],
    "lora_start": 0.0,
    "lora_end": 0.25,
    "lora_2_start": 0.5,
    "lora_2_end": 1.0,
}


def _filled(query: dict[str, str]) -> dict[str, object]:
    return dict(zip((*session.FIELDS, "randomize"), session.form_values(query, DEFAULTS, 60), strict=True))


def test_the_forms_range_is_the_requests_start_and_end():
    request = history.request_of(FORM, 1 << 20)
    (spec,) = request.loras
    # 0 is every step from the first: left unset; the empty second slot's range reaches no LoRA.
    assert (spec.ref, spec.scale, spec.start, spec.end) == (LORA, 0.8, None, 0.25)
    # Checked, it is the schedule POST / makes of `start`/`end` (the engine's one reading).
    assert normalise_loras(request.loras, 4) == normalise_loras((LoraSpec(LORA, 0.8, end=0.25),), 4)
    # The whole run (0 to 1) is the request a form without ranges made.
    whole = history.request_of(FORM | {"lora_end": 1.0}, 1 << 20)
    assert whole.loras == (LoraSpec(LORA, 0.8),)


def test_a_results_link_and_history_entry_carry_the_range_and_put_it_back():
    made = video_result(GenerateRequest(prompt="a fox", loras=(LoraSpec(LORA, 0.8, end=0.25),)))
    link, _, entries = history.remember(FORM, made, "https://space.example/")
    query = dict(parse_qsl(urlsplit(link).query))
    assert query["lora_end"] == "0.25"
    # The defaults (from 0, to 1) and the empty slot's range are left out: a short link.
    assert not {"lora_start", "lora_2_start", "lora_2_end"} & query.keys()
    assert entries[0]["params"] == query
    filled = _filled(query)
    assert (filled["lora"], filled["lora_start"], filled["lora_end"]) == (LORA, 0.0, 0.25)
    # A link naming a LoRA without a range is that LoRA on every step (not the range the form had before).
    plain = _filled({"lora": LORA})
    assert (plain["lora_start"], plain["lora_end"]) == (0.0, 1.0)
    # A range outside [0, 1] in a link is not one the form can show: the form keeps what it has.
    assert _filled({"lora_start": "2"})["lora_start"] != 2.0
