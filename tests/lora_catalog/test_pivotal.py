"""The catalogue and pivotal-tuning LoRAs: which embeddings file goes with a LoRA, and its tokens as trigger words."""

from __future__ import annotations

import pytest

from lora_catalog import errors
from lora_catalog.cards import entry_from_hub_item, pick_weight_name
from lora_catalog.entries import LoraEntry
from lora_catalog.hub import HubSource
from lora_catalog.local import scan_local_dirs
from lora_catalog.pivotal import embeddings_for, is_embeddings_file, token_runs, with_token_triggers
from serving.ui.formatting import insert_trigger
from tests.support.loras import SDXL, WEIGHTS

SCRIPT_REPO = [WEIGHTS, "y2k.safetensors", "y2k_emb.safetensors", "README.md"]


@pytest.mark.parametrize(
    ("weight", "files", "expected"),
    [
        (WEIGHTS, SCRIPT_REPO, "y2k_emb.safetensors"),
        ("y2k.safetensors", SCRIPT_REPO, "y2k_emb.safetensors"),
        (WEIGHTS, [WEIGHTS, "embeddings.safetensors"], "embeddings.safetensors"),
        (WEIGHTS, [WEIGHTS, "embeddings.safetensors", "x_emb.safetensors"], "embeddings.safetensors"),
        (WEIGHTS, [WEIGHTS, "a_emb.safetensors", "b_emb.safetensors"], None),
        # A folder of LoRAs: b's tokens are never a's, nor is a stray embeddings.safetensors.
        ("a.safetensors", ["a.safetensors", "b.safetensors", "b_emb.safetensors"], None),
        ("a.safetensors", ["a.safetensors", "embeddings.safetensors"], None),
        (
            "sub/a.safetensors",
            ["sub/a.safetensors", "a_emb.safetensors", "sub/a_emb.safetensors"],
            "sub/a_emb.safetensors",
        ),
        (f"sub/{WEIGHTS}", [f"sub/{WEIGHTS}", "embeddings.safetensors"], None),
        (WEIGHTS, [WEIGHTS], None),
        (None, ["x_emb.safetensors"], None),
    ],
)
def test_the_embeddings_file_naming_rule(weight, files, expected):
    assert embeddings_for(weight, files) == expected


def test_an_embeddings_file_is_never_taken_for_the_lora():
    assert pick_weight_name(["y2k.safetensors", "y2k_emb.safetensors"]) == "y2k.safetensors"
    assert pick_weight_name(SCRIPT_REPO) == WEIGHTS
    assert is_embeddings_file("Y2K_EMB.safetensors") and is_embeddings_file("sub/embeddings.safetensors")
    assert not is_embeddings_file("embeddings_v2.safetensors") and not is_embeddings_file("y2k.safetensors")


@pytest.mark.parametrize(
    ("words", "tokens", "texts", "expected"),
    [
        (("a photo of <s0><s1>",), (), (), ("a photo of <s0><s1>",)),
        (("TOK style",), (), ("a <s0><s1> cat",), ("<s0><s1>", "TOK style")),
        ((), ("<s0>", "<s1>"), (), ("<s0><s1>",)),
        (("sks",), ("<s0>", "<s1>", "<s2>"), (), ("<s0><s1><s2>", "sks")),
        (("sks",), (), (), ("sks",)),
    ],
)
def test_token_triggers_lead_the_trigger_words(words, tokens, texts, expected):
    assert with_token_triggers(words, tokens, *texts) == expected


def test_token_runs_are_found_once_each_in_order():
    assert token_runs("<s2><s3> and <s0><s1>, <s2><s3>", "<s4>") == ("<s2><s3>", "<s0><s1>", "<s4>")
    assert token_runs("<s>, s0, <S0>") == ()


def record(instance_prompt: str, *files: str) -> dict:
    widget = [{"text": "a <s0><s1> cat on a mat"}]
    card = {"base_model": SDXL, "instance_prompt": instance_prompt, "widget": widget}
    return {"id": "someone/pivotal", "cardData": card, "siblings": [{"rfilename": f} for f in files]}


def test_a_card_without_tokens_in_its_instance_prompt_gets_them_from_its_widget():
    entry = entry_from_hub_item(record("TOK", WEIGHTS, "run_emb.safetensors"), endpoint="https://hub")
    assert entry.embeddings_name == "run_emb.safetensors"
    assert entry.trigger_words == ("<s0><s1>", "TOK")
    plain = entry_from_hub_item(record("TOK", WEIGHTS), endpoint="https://hub")
    assert plain.embeddings_name is None and plain.trigger_words == ("TOK",)


def test_hub_entries_show_the_tokens_and_the_ui_inserts_them(hub, pivotal):
    source = HubSource(endpoint=hub.url, timeout_s=5)
    listed = {e.ref: e for e in source.list_loras(SDXL, limit=200)}
    current, legacy = listed[pivotal["current"]], listed[pivotal["legacy"]]
    assert (current.weight_name, current.embeddings_name) == (WEIGHTS, "current_emb.safetensors")
    # A listing has no file sizes (weight_size neither); resolving one LoRA has them.
    assert current.embeddings_size is None is current.weight_size
    assert current.trigger_words == ("a photo of <s0><s1>",)
    assert insert_trigger("a cat", None, current.trigger_words[0]) == "a photo of <s0><s1>, a cat"
    assert (legacy.embeddings_name, legacy.trigger_words) == ("embeddings.safetensors", ("<s0><s1><s2> style",))
    webui = source.resolve(pivotal["current"], weight_name="current.safetensors")
    assert (webui.weight_name, webui.embeddings_name) == ("current.safetensors", "current_emb.safetensors")
    assert webui.embeddings_size == len(pivotal.files["current"]["current_emb.safetensors"])
    assert LoraEntry.from_json(webui.to_json()) == webui


def test_asking_for_the_embeddings_file_as_the_lora_is_refused(hub, pivotal):
    source = HubSource(endpoint=hub.url, timeout_s=5)
    with pytest.raises(errors.InvalidRequestError, match=r"is a pivotal-tuning embeddings file, which loads with"):
        source.resolve(pivotal["current"], weight_name="current_emb.safetensors")


def test_local_pairs_show_their_tokens_and_embeddings_files_are_not_entries(pivotal):
    by_ref = {e.ref: e for e in scan_local_dirs([pivotal.local_dir]).entries}
    assert set(by_ref) == set(pivotal.local.values())
    mine = by_ref[pivotal.local["current"]]
    assert (mine.trigger_words, mine.embeddings_name) == (("<s0><s1>",), "mine_emb.safetensors")
    assert insert_trigger("a cat", None, mine.trigger_words[0]) == "<s0><s1>, a cat"
    assert by_ref[pivotal.local["legacy"]].trigger_words == ("<s0><s1><s2>",)
    plain = by_ref[pivotal.local["plain"]]
    assert (plain.trigger_words, plain.embeddings_name, plain.embeddings_size) == ((), None, None)
