"""Bad requests at the engine: each field out of range or of the wrong type gets a specific error naming it.

Validation happens before the Hub or the weights are touched: every refusal here is checked to have made no
Hub request and to leave the served set as it was.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine.errors import InvalidRequestError, LimitExceededError, LoraNotFoundError
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate, prime, small, unchanged
from tests.support.loras import NS

PEFT = f"{NS}/peft"
OK = GenerateRequest(prompt="a fox", steps=1, width=64, height=64, seed=1)
NAN, INF = math.nan, math.inf

# (id, changes to OK, error, message fragment)
FIELDS: list[tuple[str, dict[str, object], type[Exception], str]] = [
    ("empty prompt", {"prompt": ""}, InvalidRequestError, r"prompt is empty; accepted: 1 to 2000 characters"),
    ("blank prompt", {"prompt": " \n\t "}, InvalidRequestError, r"prompt is empty"),
    ("no prompt", {"prompt": None}, InvalidRequestError, r"prompt must be text, got NoneType"),
    ("bytes prompt", {"prompt": b"a fox"}, InvalidRequestError, r"prompt must be text, got bytes"),
    ("long prompt", {"prompt": "x" * 2001}, LimitExceededError, r"prompt has 2001 characters; accepted: at most 2000"),
    ("huge prompt", {"prompt": "fox " * 2_500_000}, LimitExceededError, r"prompt has 9999999 characters"),
    ("surrogate", {"prompt": "a \ud800 fox"}, InvalidRequestError, r"prompt is not valid UTF-8 text .*position 2"),
    ("NUL", {"prompt": "a\x00fox"}, InvalidRequestError, r"control character U\+0000 at position 1"),
    ("ESC", {"prompt": "a\x1b[31mfox"}, InvalidRequestError, r"control character U\+001B at position 1"),
    ("DEL", {"prompt": "fox\x7f"}, InvalidRequestError, r"control character U\+007F at position 3"),
    ("C1", {"prompt": "fox\x85"}, InvalidRequestError, r"control character U\+0085"),
    ("negative surrogate", {"negative_prompt": "\udfff"}, InvalidRequestError, r"negative_prompt is not valid UTF-8"),
    ("negative int", {"negative_prompt": 5}, InvalidRequestError, r"negative_prompt must be text, got int"),
    ("negative long", {"negative_prompt": "y" * 2001}, LimitExceededError, r"negative_prompt has 2001 characters"),
    ("steps 0", {"steps": 0}, InvalidRequestError, r"steps=0 is out of range; accepted: an integer from 1 to 60"),
    ("steps -1", {"steps": -1}, InvalidRequestError, r"steps=-1 is out of range"),
    ("steps 61", {"steps": 61}, LimitExceededError, r"steps=61 is out of range; accepted: an integer from 1 to 60"),
    ("steps 1e9", {"steps": 10**9}, LimitExceededError, r"steps=1000000000 is out of range"),
    ("steps bool", {"steps": True}, InvalidRequestError, r"steps=True is not an integer"),
    ("steps str", {"steps": "4"}, InvalidRequestError, r"steps='4' is not an integer"),
    ("steps float", {"steps": 2.5}, InvalidRequestError, r"steps=2\.5 is not an integer"),
    ("steps nan", {"steps": NAN}, InvalidRequestError, r"steps=nan is not an integer"),
    ("steps inf", {"steps": INF}, InvalidRequestError, r"steps=inf is not an integer"),
    ("guidance nan", {"guidance": NAN}, InvalidRequestError, r"guidance=nan is not a number; accepted: .* 0 to 30"),
    ("guidance inf", {"guidance": INF}, InvalidRequestError, r"guidance=inf is not a number"),
    ("guidance -inf", {"guidance": -INF}, InvalidRequestError, r"guidance=-inf is not a number"),
    ("guidance -1", {"guidance": -1.0}, InvalidRequestError, r"guidance=-1 is out of range; accepted: .* 0 to 30"),
    ("guidance 31", {"guidance": 31}, InvalidRequestError, r"guidance=31 is out of range"),
    ("guidance bool", {"guidance": True}, InvalidRequestError, r"guidance=True is not a number"),
    ("guidance str", {"guidance": "5"}, InvalidRequestError, r"guidance='5' is not a number"),
    ("width odd", {"width": 65}, InvalidRequestError, r"width=65 is not a multiple of 8; accepted: 64 to 256 in 8s"),
    ("width 0", {"width": 0}, InvalidRequestError, r"width=0 is out of range; accepted: an integer from 64 to 256"),
    ("width huge", {"width": 10**6}, LimitExceededError, r"width=1000000 is out of range"),
    ("height neg", {"height": -64}, InvalidRequestError, r"height=-64 is out of range"),
    ("height bool", {"height": True}, InvalidRequestError, r"height=True is not an integer"),
    ("height str", {"height": "64"}, InvalidRequestError, r"height='64' is not an integer"),
    ("height nan", {"height": NAN}, InvalidRequestError, r"height=nan is not an integer"),
    (
        "seed -1",
        {"seed": -1},
        InvalidRequestError,
        r"seed=-1 is out of range; accepted: an integer from 0 to 4294967295",
    ),
    ("seed 2**32", {"seed": 2**32}, LimitExceededError, r"seed=4294967296 is out of range"),
    ("seed float", {"seed": 1.5}, InvalidRequestError, r"seed=1\.5 is not an integer"),
    ("seed str", {"seed": "7"}, InvalidRequestError, r"seed='7' is not an integer"),
    ("seed bool", {"seed": False}, InvalidRequestError, r"seed=False is not an integer"),
    ("seed inf", {"seed": -INF}, InvalidRequestError, r"seed=-inf is not an integer"),
    ("scale nan", {"loras": (LoraSpec(PEFT, NAN),)}, InvalidRequestError, rf"scale of {PEFT}=nan is not a number"),
    ("scale inf", {"loras": (LoraSpec(PEFT, INF),)}, InvalidRequestError, r"=inf is not a number; accepted: .*-2 to 2"),
    ("scale 3", {"loras": (LoraSpec(PEFT, 3.0),)}, InvalidRequestError, rf"scale of {PEFT}=3 is out of range"),
    ("scale -2.5", {"loras": (LoraSpec(PEFT, -2.5),)}, InvalidRequestError, r"=-2\.5 is out of range"),
    ("scale bool", {"loras": (LoraSpec(PEFT, True),)}, InvalidRequestError, r"=True is not a number"),
    ("scale str", {"loras": (LoraSpec(PEFT, "1"),)}, InvalidRequestError, r"='1' is not a number"),
    ("loras str", {"loras": PEFT}, InvalidRequestError, r"loras must be a list of LoRA specs, got str"),
    ("loras dict", {"loras": ({"ref": PEFT},)}, InvalidRequestError, r"LoRA entry \{'ref': .*\} is not a LoraSpec"),
    (
        "five loras",
        {"loras": tuple(LoraSpec(f"{NS}/lora-{i}") for i in range(5))},
        LimitExceededError,
        r"5 LoRAs requested; accepted: at most 4 per request",
    ),
    (
        "same twice",
        {"loras": (LoraSpec(PEFT, 0.5), LoraSpec(PEFT, 0.7))},
        InvalidRequestError,
        rf"LoRA '{PEFT}' is listed twice; accepted: each LoRA once",
    ),
    (
        "same twice, blanks",
        {"loras": (LoraSpec(PEFT), LoraSpec(f"  {PEFT} "))},
        InvalidRequestError,
        r"is listed twice",
    ),
]

# Strings where a repo id is expected: none may reach a URL or a path.
PATH_LIKE_REFS = [
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    "~/x",
    "owner/../x",
    "owner/name/extra",
    "owner/..",
    "http://evil.example/x/y",
    "https://huggingface.co/owner/name",
    "www.example.com/x",
    "owner\\name",
    "C:\\loras\\x",
    "C:/loras/x",
    "",
    "   ",
    "local:",
    "local:../x.safetensors",
    "local:../../etc/passwd",
    "local:/etc/passwd",
    "local:styles/../../x.safetensors",
    "local:./local_peft.safetensors",
    "local:a\\b.safetensors",
    "local:C:/x.safetensors",
    "local:http://evil.example/x.safetensors",
]
BAD_REVISIONS = ["../main", "main/../x", "-x", " ", "a" * 300, "main\x00", "ref with space"]
BAD_WEIGHT_NAMES = [
    "../x.safetensors",
    "/abs/x.safetensors",
    "a\\b.safetensors",
    "C:/x.safetensors",
    "https://evil.example/x.safetensors",
    "a/./b.safetensors",
    "x.bin",
    "x.ckpt",
    "x.txt",
]


@pytest.fixture
def quiet_hub(hub):
    """The stand-in Hub with an empty request log, to show nothing reached it."""
    hub.clear_requests()
    yield hub
    assert hub.requests == [], f"a refused request reached the Hub: {[r.path for r in hub.requests]}"


@pytest.mark.parametrize(("changes", "error", "fragment"), [c[1:] for c in FIELDS], ids=[c[0] for c in FIELDS])
def test_a_bad_field_is_refused_before_anything_runs(engine, loaded, pristine, quiet_hub, changes, error, fragment):
    with unchanged(engine, loaded, pristine), pytest.raises(error, match=fragment):
        generate(engine, replace(OK, **changes))


@pytest.mark.parametrize("ref", [*PATH_LIKE_REFS, None, 42, b"owner/name"])
def test_a_path_like_or_non_text_repo_id_is_refused(engine, loaded, pristine, quiet_hub, ref):
    with unchanged(engine, loaded, pristine), pytest.raises(InvalidRequestError, match=r"accepted"):
        generate(engine, replace(OK, loras=(LoraSpec(ref),)))
    with pytest.raises(InvalidRequestError, match=r"accepted"):
        engine.check_lora(LoraSpec(ref))


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_path_like_revision_is_refused(engine, quiet_hub, revision):
    with pytest.raises(InvalidRequestError, match=r"revision .* is not accepted; accepted: a branch or tag name"):
        generate(engine, replace(OK, loras=(LoraSpec(PEFT, revision=revision),)))


@pytest.mark.parametrize("weight_name", BAD_WEIGHT_NAMES)
def test_a_path_like_or_non_safetensors_weight_name_is_refused(engine, quiet_hub, weight_name):
    with pytest.raises(InvalidRequestError, match=r"weight_name .* accepted"):
        generate(engine, replace(OK, loras=(LoraSpec(PEFT, weight_name=weight_name),)))


def test_a_local_link_out_of_the_folder_is_refused(make_engine, tmp_path, fixtures, loaded, pristine):
    folder = tmp_path / "loras"
    folder.mkdir()
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes((fixtures.local_dir / "local_peft.safetensors").read_bytes())
    (folder / "escape.safetensors").symlink_to(outside)
    engine = make_engine(local_lora_dir=folder)
    with unchanged(engine, loaded, pristine), pytest.raises(InvalidRequestError, match=r"points outside the local"):
        generate(engine, replace(OK, loras=(LoraSpec("local:escape.safetensors"),)))
    for name in ("nope.safetensors", "~/x.safetensors"):  # "~" is a folder name here, never the home folder
        with pytest.raises(LoraNotFoundError, match=rf"'local:{name}' does not exist in the local LoRA folder"):
            generate(engine, replace(OK, loras=(LoraSpec(f"local:{name}"),)))


@pytest.mark.parametrize(
    "twin",
    [LoraSpec(PEFT, 0.3, revision="main"), LoraSpec(PEFT, 0.3, weight_name="pytorch_lora_weights.safetensors")],
    ids=["by revision", "by weight name"],
)
def test_the_same_lora_named_two_ways_is_refused(make_engine, fixtures, twin):
    engine, good, image = prime(make_engine, fixtures)
    before = engine.status().applied
    with pytest.raises(InvalidRequestError, match=rf"LoRA '{PEFT}' is listed twice"):
        generate(engine, small(good, twin))
    assert engine.status().applied == before
    assert generate(engine, small(good)).image.tobytes() == image


def test_numbers_given_as_whole_floats_are_accepted_as_integers(engine):
    result = generate(engine, replace(OK, steps=1.0, width=64.0, seed=3.0))
    assert (result.request.steps, result.request.width, result.request.seed) == (1, 64, 3)
    assert all(type(v) is int for v in (result.request.steps, result.request.width, result.request.seed))
    again = generate(engine, replace(OK, prompt="  a \n fox  ", seed=3))
    assert again.request.prompt == "a fox"
    assert again.image.tobytes() == result.image.tobytes()
