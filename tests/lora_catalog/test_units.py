"""The catalogue's pure parts: base families, ref validation, licenses, entry JSON and card parsing."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime

import pytest

from lora_catalog import (
    KNOWN_BASES,
    Family,
    InvalidRepoIdError,
    InvalidRequestError,
    InvalidWeightNameError,
    LoraEntry,
    SnapshotError,
    family_from_keys,
    family_from_metadata,
    family_of_base,
    is_non_commercial,
    parse_local_ref,
    validate_repo_id,
    validate_revision,
    validate_weight_name,
)
from lora_catalog.cards import entry_from_hub_item, pick_weight_name

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
ENDPOINT = "https://hub.example"


@pytest.mark.parametrize(
    ("repo_id", "family"),
    [
        (SDXL, Family.SDXL),
        ("StabilityAI/Stable-Diffusion-XL-Base-1.0", Family.SDXL),
        ("RunDiffusion/Juggernaut-XL-v10", Family.SDXL),
        ("SG161222/RealVisXL_V5.0", Family.SDXL),
        ("runwayml/stable-diffusion-v1-5", Family.SD15),
        ("stabilityai/stable-diffusion-2-1-base", Family.SD2),
        ("black-forest-labs/FLUX.1-schnell", Family.FLUX),
        ("stabilityai/stable-diffusion-xl-refiner-1.0", Family.UNKNOWN),
        ("playgroundai/playground-v2.5-1024px-aesthetic", Family.UNKNOWN),
        ("someone/something", Family.UNKNOWN),
    ],
)
def test_family_of_base(repo_id: str, family: Family) -> None:
    assert family_of_base(repo_id) is family


def test_known_bases_are_consistent() -> None:
    ids = [b.repo_id for b in KNOWN_BASES]
    assert len(ids) == len(set(ids))
    assert all(family_of_base(b.repo_id) is b.family and b.display_name for b in KNOWN_BASES)
    assert KNOWN_BASES[0].repo_id == SDXL


@pytest.mark.parametrize(
    ("metadata", "family"),
    [
        ({"ss_base_model_version": "sdxl_base_v1-0"}, Family.SDXL),
        ({"ss_base_model_version": "sdxl_v1"}, Family.SDXL),
        ({"ss_base_model_version": "sd_v1"}, Family.SD15),
        ({"ss_base_model_version": "sd_v2_768_v"}, Family.SD2),
        ({"ss_base_model_version": "flux1"}, Family.FLUX),
        ({"modelspec.architecture": "stable-diffusion-xl-v1-base/lora"}, Family.SDXL),
        ({"modelspec.architecture": "stable-diffusion-xl-v1-refiner/lora"}, Family.UNKNOWN),
        ({"modelspec.architecture": "stable-diffusion-v1/lora"}, Family.SD15),
        ({"modelspec.architecture": "stable-diffusion-v2-768-v/lora"}, Family.SD2),
        ({"modelspec.architecture": "flux-1-dev/lora"}, Family.FLUX),
        ({"modelspec.architecture": "stable-diffusion-v3-medium/lora"}, Family.UNKNOWN),
        ({"ss_base_model_version": "sd3"}, Family.UNKNOWN),
        # The architecture is the more specific claim and wins over the kohya version.
        ({"modelspec.architecture": "flux-1-dev/lora", "ss_base_model_version": "sdxl_base_v1-0"}, Family.FLUX),
        ({"ss_v2": "True", "ss_sd_model_name": "whatever.ckpt"}, Family.SD2),
        ({"ss_v2": "False", "ss_sd_model_name": "sd_xl_base_1.0.safetensors"}, Family.SDXL),
        ({"ss_v2": "False", "ss_sd_model_name": "v1-5-pruned-emaonly.safetensors"}, Family.SD15),
        ({"format": "pt"}, None),
        ({}, None),
    ],
)
def test_family_from_metadata(metadata: dict[str, str], family: Family | None) -> None:
    assert family_from_metadata(metadata) == family


@pytest.mark.parametrize(
    ("names", "family"),
    [
        (["lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"], Family.SDXL),
        (["lora_unet_input_blocks_4_1_transformer_blocks_1_attn1_to_q.lora_up.weight"], Family.SDXL),
        (["text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"], Family.SDXL),
        (["unet.mid_block.attentions.0.transformer_blocks.1.attn1.to_q.lora_A.weight"], Family.SDXL),
        (["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"], Family.SD15),
        (["unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight"], Family.SD15),
        (["transformer.single_transformer_blocks.0.attn.to_k.lora_A.weight"], Family.FLUX),
        (["lora_unet_double_blocks_0_img_attn_proj.lora_down.weight"], Family.FLUX),
        (["transformer.transformer_blocks.1.attn.to_q.lora_A.weight"], None),  # SD3 or Flux: not SDXL
        (["unet.mid_block.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight"], None),
        ([], None),
    ],
)
def test_family_from_keys(names: list[str], family: Family | None) -> None:
    assert family_from_keys(names) == family


@pytest.mark.parametrize(
    ("license_id", "name", "link", "expected"),
    [
        ("cc-by-nc-4.0", None, None, True),
        ("cc-by-nc-sa-4.0", None, None, True),
        ("CC-BY-NC-ND-4.0", None, None, True),
        ("other", "flux-1-dev-non-commercial-license", None, True),
        ("other", "Research Only License", None, True),
        ("other", "stabilityai-nc-research-community", None, True),
        (
            "other",
            "bespoke-lora-trained-license",
            "https://x/licenses?allowCommercialUse=None&allowNoCredit=True",
            True,
        ),
        ("other", "bespoke-lora-trained-license", "https://x/licenses?allowCommercialUse=Sell", False),
        ("openrail++", None, None, False),
        ("creativeml-openrail-m", None, None, False),
        ("apache-2.0", None, None, False),
        ("mit", None, None, False),
        ("cc-by-4.0", None, None, False),
        ("cc-by-sa-4.0", None, None, False),
        ("other", "stabilityai-ai-community", None, False),
        (None, None, None, False),
    ],
)
def test_non_commercial_detection(license_id: str | None, name: str | None, link: str | None, expected: bool) -> None:
    assert is_non_commercial(license_id, name, link) is expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "it is empty"),
        ("   ", "it is empty"),
        ("../etc/passwd", "it contains '..'|it is a file path"),
        ("owner/../x", "it contains '..'"),
        ("/abs/path", "it is a file path"),
        ("C:/loras/x", "it is a file path"),
        ("owner\\name", "it is a file path"),
        ("https://huggingface.co/owner/name", "it is a URL"),
        ("owner/" + "n" * 96, "it is 102 characters long"),
        ("just-a-name", "it is not owner/name"),
        ("a/b/c", "it is not owner/name"),
        ("owner/na me", "it is not owner/name"),
    ],
)
def test_invalid_repo_ids_are_named(value: str, reason: str) -> None:
    with pytest.raises(
        InvalidRepoIdError,
        match=rf"LoRA repo id {re.escape(repr(value))} is not accepted \(({reason})\); "
        r"accepted form: 'owner/name'",
    ):
        validate_repo_id(value)


def test_valid_repo_ids_are_stripped() -> None:
    assert validate_repo_id("  owner/my-lora_v1.0 ") == "owner/my-lora_v1.0"


def test_revision_and_weight_name_validation() -> None:
    assert validate_revision(None) is None
    assert validate_revision("a" * 40) == "a" * 40
    assert validate_revision("refs/pr/1") == "refs/pr/1"
    with pytest.raises(InvalidRequestError, match=r"revision '\.\./main' is not accepted"):
        validate_revision("../main")
    assert validate_weight_name("sub/x.safetensors") == "sub/x.safetensors"
    with pytest.raises(InvalidWeightNameError, match=r"weight_name 'model.bin' is a pickle file; only '.safetensors'"):
        validate_weight_name("model.bin")
    with pytest.raises(InvalidWeightNameError, match=r"weight_name 'x.onnx' is not accepted; accepted: a '.safetens"):
        validate_weight_name("x.onnx")
    with pytest.raises(InvalidWeightNameError, match=r"weight_name '\.\./x.safetensors' is not accepted; accepted: a"):
        validate_weight_name("../x.safetensors")
    with pytest.raises(InvalidWeightNameError, match=r"weight_name '/x.safetensors' is not accepted"):
        validate_weight_name("/x.safetensors")


def test_local_refs() -> None:
    assert parse_local_ref("local:styles/pixel.safetensors").as_posix() == "styles/pixel.safetensors"
    with pytest.raises(InvalidRepoIdError, match=r"local ref 'local:\.\./x.safetensors' is not accepted"):
        parse_local_ref("local:../x.safetensors")
    with pytest.raises(InvalidRepoIdError, match=r"local ref 'local:' names no file"):
        parse_local_ref("local:")


def test_entry_json_round_trip_and_tolerance() -> None:
    entry = LoraEntry(
        ref="o/n",
        repo_id="o/n",
        title="n",
        base_models=(SDXL,),
        family=Family.SDXL,
        trigger_words=("pxl",),
        preview_urls=("https://x/y.png",),
        license="cc-by-nc-4.0",
        non_commercial=True,
        downloads=5,
        likes=2,
        trending_score=1.5,
        last_modified=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        weight_name="pytorch_lora_weights.safetensors",
        weight_size=1234,
        tags=("lora",),
        sha="a" * 40,
    )
    assert LoraEntry.from_json(entry.to_json()) == entry
    newer = {**entry.to_json(), "added_in_format_2": {"x": 1}, "family": "sd9", "downloads": "many", "likes": True}
    degraded = LoraEntry.from_json(newer)
    assert (degraded.family, degraded.downloads, degraded.likes) == (Family.UNKNOWN, 0, 0)
    with pytest.raises(SnapshotError, match=r"entry has ref=None; accepted: a non-empty string"):
        LoraEntry.from_json({"title": "no ref"})
    with pytest.raises(SnapshotError, match=r"source='ftp'; accepted: hub, local"):
        LoraEntry.from_json({"ref": "o/n", "source": "ftp"})


def test_pick_weight_name() -> None:
    assert pick_weight_name(["a.safetensors", "pytorch_lora_weights.safetensors"]) == "pytorch_lora_weights.safetensors"
    assert pick_weight_name(["README.md", "x.safetensors"]) == "x.safetensors"
    assert pick_weight_name(["a.safetensors", "b.safetensors"]) is None
    assert pick_weight_name(["adapter_model.bin"]) is None


def test_hub_record_with_every_field_wrong_still_makes_an_entry() -> None:
    item = {
        "id": "o/broken",
        "sha": 12,
        "cardData": {
            "base_model": 5,
            "instance_prompt": 42,
            "widget": "not a list",
            "license": ["mit", "apache-2.0"],
        },
        "siblings": "nope",
        "downloads": -3,
        "likes": "ten",
        "trendingScore": float("nan"),
        "lastModified": "yesterday",
        "tags": ["lora", 7, "base_model:adapter:" + SDXL],
    }
    entry = entry_from_hub_item(item, endpoint=ENDPOINT, listed_base=SDXL)
    assert entry.base_models == (SDXL,)
    assert entry.family is Family.SDXL
    assert (entry.trigger_words, entry.preview_urls, entry.license) == ((), (), "mit")
    assert (entry.downloads, entry.likes, entry.trending_score, entry.last_modified) == (0, 0, 0.0, None)
    assert (entry.sha, entry.weight_name, entry.tags) == (None, None, ("lora",))


def test_hub_record_previews_skip_unsafe_urls_and_resolve_relative_ones() -> None:
    item = {
        "id": "o/p",
        "sha": "b" * 40,
        "cardData": {
            "widget": [
                "text only",
                {"output": "nope"},
                {"output": {"url": "../../etc/passwd"}},
                {"output": {"url": "javascript:alert(1)"}},
                {"output": {"url": "./images/a b.png"}, "text": "first prompt"},
                {"output": {"url": "https://cdn.example/x.png"}},
            ]
        },
        "siblings": [{"rfilename": "other.png"}, {"rfilename": "x.safetensors"}],
    }
    entry = entry_from_hub_item(item, endpoint=ENDPOINT)
    assert entry.preview_urls == (f"{ENDPOINT}/o/p/resolve/{'b' * 40}/images/a%20b.png",)
    assert entry.trigger_words == ("first prompt",)
    assert entry.family is Family.UNKNOWN


def _previews(*urls: str, endpoint: str = ENDPOINT) -> tuple[str, ...]:
    item = {"id": "o/p", "sha": "b" * 40, "cardData": {"widget": [{"output": {"url": u}} for u in urls]}}
    return entry_from_hub_item(item, endpoint=endpoint).preview_urls


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("images/a.png", f"{ENDPOINT}/o/p/resolve/{'b' * 40}/images/a.png"),
        (f"{ENDPOINT}/o/p/resolve/main/images/a.png", f"{ENDPOINT}/o/p/resolve/main/images/a.png"),
        (f"{ENDPOINT}/o/p/blob/main/images/a.png?download=true", f"{ENDPOINT}/o/p/resolve/main/images/a.png"),
        ("https://HUB.example/o/q/raw/refs%2Fpr%2F1/b%20c.webp", f"{ENDPOINT}/o/q/resolve/refs%2Fpr%2F1/b%20c.webp"),
    ],
)
def test_card_previews_in_the_repo_or_on_the_hub_are_shown_through_its_resolve_url(url: str, shown: str) -> None:
    assert _previews(url) == (shown,)


@pytest.mark.parametrize(
    "url",
    [
        "https://attacker.example/track.svg",
        "https://attacker.example/x.png",
        "//attacker.example/x.png",
        "http://hub.example/o/p/resolve/main/a.png",  # not the endpoint's scheme
        "https://hub.example.attacker.example/o/p/resolve/main/a.png",
        "https://hub.example:8443/o/p/resolve/main/a.png",
        "https://hub.example@attacker.example/o/p/resolve/main/a.png",
        "https://user@hub.example/o/p/resolve/main/a.png",
        "https://hub.example/api/models/o/p/a.png",
        "https://hub.example/o/p/resolve/main/../../x.png",
        "https://hub.example/o/p/resolve/main/%2e%2e/x.png",
        "https://hub.example/o/p/resolve/main/track.svg",  # Gradio's Gallery downloads an .svg on the server
        "images/track.svg",
        "images/clip.mp4",
        "data:image/png;base64,AAAA",
        "file:///etc/passwd.png",
    ],
)
def test_card_previews_anywhere_else_are_not_shown(url: str) -> None:
    assert _previews(url) == ()


def test_a_hub_endpoint_with_a_path_keeps_previews_under_that_path() -> None:
    mirror = "https://mirror.example/hf"
    assert _previews(f"{mirror}/o/p/resolve/main/a.png", endpoint=mirror) == (f"{mirror}/o/p/resolve/main/a.png",)
    assert _previews("https://mirror.example/o/p/resolve/main/a.png", endpoint=mirror) == ()


def test_a_card_preview_on_another_host_makes_no_request_from_the_gallery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradio's Gallery fetches an .svg URL on the server to inline it; a card's preview must never get there."""
    import gradio as gr
    from gradio import processing_utils

    asked: list[str] = []

    async def recorded(url: str, *args: object, **kwargs: object) -> object:
        asked.append(url)
        raise OSError("no network in this test")

    monkeypatch.setattr(processing_utils, "async_ssrf_protected_get", recorded)
    previews = _previews("https://attacker.example/track.svg")
    for url in previews:  # what the catalogue gallery is given (serving/ui/events.py)
        with contextlib.suppress(OSError):
            gr.Gallery().postprocess([(url, "title")])
    assert asked == []
    assert previews == ()


def test_family_prefers_the_base_it_was_listed_under() -> None:
    item = {"id": "o/both", "cardData": {"base_model": ["black-forest-labs/FLUX.1-dev", SDXL]}}
    assert entry_from_hub_item(item, endpoint=ENDPOINT, listed_base=SDXL).family is Family.SDXL
    assert entry_from_hub_item(item, endpoint=ENDPOINT).family is Family.FLUX
    only_flux = {"id": "o/flux", "cardData": {"base_model": "black-forest-labs/FLUX.1-dev"}}
    assert entry_from_hub_item(only_flux, endpoint=ENDPOINT, listed_base=SDXL).family is Family.FLUX


def test_hub_record_without_a_usable_id_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"record has id '\.\./x'; accepted: 'owner/name'"):
        entry_from_hub_item({"id": "../x"}, endpoint=ENDPOINT)
