"""A Wan 2.2 A14B pair's names (`lora_catalog.pairs`): which file is which stage, how a repo's pair is named by
`weight_name` (none for a repo of one pair, a folder with a trailing '/', two files joined with '+'), and the
Hub's entry for one: its weight name both files (high first), its size their sum, its header the high file's."""

from __future__ import annotations

import pytest
import torch

from lora_catalog.errors import AmbiguousWeightsError, InvalidRequestError, InvalidWeightNameError, LoraNotFoundError
from lora_catalog.hub import HubSource
from lora_catalog.pairs import choose_pair, stage_in_name
from lora_catalog.refs import validate_weight_name
from tests.support.loras import sft

PAIR = ("x_high_noise.safetensors", "x_low_noise.safetensors")
SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
LIGHTNING = ("V1.1/high_noise_model.safetensors", "V1.1/low_noise_model.safetensors")


def test_a_file_says_its_stage_by_its_name_in_an_explicit_form_only():
    explicit = {
        PAIR[0]: 0,
        PAIR[1]: 1,
        "Wan2.2-High-Noise": 0,
        "high_low_noise": 1,
        # Wan2.2-Lightning's names: lightx2v's folders, Kijai's files, lightx2v's later files.
        LIGHTNING[0]: 0,
        "Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16.safetensors": 0,
        "Wan2.2-Lightning_I2V-A14B-4steps-lora_LOW_fp16.safetensors": 1,
        "Wan_2_2_I2V_A14B_HIGH_lightx2v_4step_lora_260412_rank_64_fp16.safetensors": 0,
        "wan2.2_t2v_A14b_low_noise_lora_rank64_lightx2v_4step_1217.safetensors": 1,
    }
    # A capital word alone is no stage: a style, a slider's setting (both go to both transformers).
    unsaid = ["HIGH_FASHION_style.safetensors", "Detail Slider (LOW)", "x_HIGH_fp16.safetensors", "x-LOW.safetensors"]
    unsaid += ["low_light.safetensors", "Lightning_HIGH_low_noise", "wan22_lightning_bolt_style.safetensors"]
    assert {name: stage_in_name(name) for name in explicit} == explicit
    assert [stage_in_name(name) for name in unsaid] == [None] * len(unsaid)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("V1.1/", "V1.1/"),
        (" a/V1.1/ ", "a/V1.1/"),
        ("x_high_noise.safetensors+x_low_noise.safetensors", "x_high_noise.safetensors+x_low_noise.safetensors"),
        ("x.safetensors", "x.safetensors"),
    ],
)
def test_a_weight_name_may_name_a_pair(value, expected):
    assert validate_weight_name(value) == expected


@pytest.mark.parametrize(
    "value", ["../V1.1/", "/", "x.safetensors+../y.safetensors", "x.safetensors+y.bin", "x.safetensors+y.ckpt"]
)
def test_a_pair_name_with_a_bad_part_is_refused(value):
    with pytest.raises(InvalidWeightNameError):
        validate_weight_name(value)


def test_choosing_a_repos_pair():
    files = (*LIGHTNING, "V1/high_noise_model.safetensors", "V1/low_noise_model.safetensors", *PAIR)
    assert choose_pair("r", PAIR, None) == PAIR
    assert choose_pair("r", PAIR[::-1], None) == PAIR
    # Not a pair: two files that are not one high and one low, or more than two, or one named.
    assert choose_pair("r", ("a.safetensors", "b.safetensors"), None) is None
    assert choose_pair("r", files, None) is None
    assert choose_pair("r", files, PAIR[0]) is None
    assert choose_pair("r", files, "V1.1/") == LIGHTNING
    assert choose_pair("r", files, f"{PAIR[1]}+{PAIR[0]}") == PAIR
    with pytest.raises(InvalidRequestError, match=r"folder 'V1.1/' .* holds 3 .safetensors files"):
        choose_pair("r", (*files, "V1.1/extra.safetensors"), "V1.1/")
    with pytest.raises(LoraNotFoundError, match=r"file 'y_low_noise.safetensors' of pair"):
        choose_pair("r", files, f"{PAIR[0]}+y_low_noise.safetensors")


def test_the_hubs_entry_for_a_pair_names_both_files_and_reads_the_high_ones_header(clean_hub):
    high, low = (sft({"blocks.0.attn1.to_q.lora_A.weight": torch.full((4, 8), float(n))}) for n in (1, 2))
    clean_hub.add_repo("pairs/lightning-like", {LIGHTNING[0]: high, LIGHTNING[1]: low, "README.md": b"# x"})
    clean_hub.add_repo("pairs/one-pair", {PAIR[1]: low, PAIR[0]: high})
    source = HubSource(endpoint=clean_hub.url, timeout_s=5.0)
    folder = source.resolve("pairs/lightning-like", weight_name="V1.1/")
    assert (folder.weight_name, folder.weight_size) == ("+".join(LIGHTNING), len(high) + len(low))
    assert source.resolve("pairs/one-pair").weight_name == "+".join(PAIR)
    assert source.read_remote_header(folder).tensors


def test_a_repo_of_a_high_and_a_low_file_is_a_pair_only_where_its_cards_base_may_have_two_stages(clean_hub):
    high, low = (sft({"blocks.0.attn1.to_q.lora_A.weight": torch.full((4, 8), float(n))}) for n in (1, 2))
    card = "---\nbase_model: {}\n---\n# x".format
    for repo, base in (("pairs/wan22", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"), ("pairs/sdxl", SDXL)):
        clean_hub.add_repo(repo, {PAIR[0]: high, PAIR[1]: low, "README.md": card(base).encode()})
    source = HubSource(endpoint=clean_hub.url, timeout_s=5.0)
    assert source.resolve("pairs/wan22").weight_name == "+".join(PAIR)
    # On SDXL the names say no stage: two files, neither named, as any repo of two (Civitai's rule too).
    with pytest.raises(AmbiguousWeightsError, match="pass weight_name"):
        source.resolve("pairs/sdxl")
    assert source.resolve("pairs/sdxl", weight_name=PAIR[1]).weight_name == PAIR[1]
