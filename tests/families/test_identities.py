"""Each family's identity, declared once, and how the catalogue reads it where several families' signs show."""

from __future__ import annotations

import pytest

from families import IDENTITIES, TINY_MODEL_IDS, Family, identity_of
from lora_catalog.bases import KNOWN_BASES, family_from_keys, family_from_metadata, family_of_base
from lora_catalog.civitai.bases import CIVITAI_BASES

FLUX_BLOCK = "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"
SDXL_CLIP_G = "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"
KOHYA_CLIP_L = "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"
SD_FIRST_ATTENTION = "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"


@pytest.mark.parametrize("family", [f for f in Family if f is not Family.UNKNOWN])
def test_every_registered_family_has_its_identity_and_its_bases_name_it(family):
    identity = identity_of(family)
    assert identity.family is family and identity.label
    assert identity.model_id == identity.bases[0].repo_id
    assert all(family_of_base(base.repo_id) is family for base in identity.bases)
    if identity.tiny_id is not None:
        assert TINY_MODEL_IDS[identity.tiny_id] == identity.model_id


def test_unknown_is_no_registered_family():
    registered = "sdxl, sd15, sd2, flux, zimage, flux2, qwen_image, flux_kontext, flux2_dev, qwen_image_edit"
    with pytest.raises(ValueError, match=f"registered: {registered}"):
        identity_of(Family.UNKNOWN)


def test_the_catalogues_tables_hold_exactly_the_identities_entries():
    assert [(b.repo_id, b.family) for b in KNOWN_BASES] == [
        (b.repo_id, i.family) for i in IDENTITIES.values() for b in i.bases
    ]
    assert sorted((b.label, b.family) for b in CIVITAI_BASES) == sorted(
        (c.label, i.family) for i in IDENTITIES.values() for c in i.civitai
    )


def test_a_flux_lora_with_kohyas_clip_part_is_labelled_flux_not_sdxl():
    # `lora_te1_` is SDXL's first text encoder too; FLUX, the newer architecture, carries it as its CLIP-L.
    assert family_from_keys([KOHYA_CLIP_L]) is Family.SDXL
    assert family_from_keys([KOHYA_CLIP_L, FLUX_BLOCK]) is Family.FLUX


def test_flux2s_own_layers_label_it_and_the_block_names_it_shares_with_flux1_stay_flux1s():
    """The catalogue labels by names alone: FLUX.2's fused single-block projection, SwiGLU and shared modulations
    are its own; BFL's block names are FLUX.1's too (the engine's judgement reads the shapes as well)."""
    shared = "diffusion_model.single_blocks.0.linear1.lora_A.weight"
    assert family_from_keys([shared, "transformer.single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A.weight"]) is (
        Family.FLUX2
    )
    assert family_from_keys(["diffusion_model.double_stream_modulation_img.lin.lora_A.weight"]) is Family.FLUX2
    assert family_from_keys([shared]) is Family.FLUX


def test_sdxl_names_beat_the_names_sd1_and_sd2_share_and_those_are_labelled_sd15():
    assert family_from_keys([SD_FIRST_ATTENTION]) is Family.SD15
    assert family_from_keys([SD_FIRST_ATTENTION, SDXL_CLIP_G]) is Family.SDXL


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("flux_xl_base.safetensors", Family.FLUX),
        ("z-image-sdxl-mix.safetensors", Family.ZIMAGE),
        ("flux-2-klein-4b.safetensors", Family.FLUX2),
        ("sd_xl_v1-5_merge.safetensors", Family.SDXL),
        ("sd15_v2-1_merge.ckpt", Family.SD2),
        # A spelling holding another's is the more specific: [dev]'s holds klein's, the edit model's Qwen-Image's.
        ("flux-2-dev.safetensors", Family.FLUX2_DEV),
        ("qwen_image_edit_bf16.safetensors", Family.QWEN_IMAGE_EDIT),
        ("flux1-kontext-dev.safetensors", Family.FLUX_KONTEXT),
    ],
)
def test_a_checkpoint_name_naming_two_families_goes_to_the_more_specific_spelling_then_the_newest(name, family):
    assert family_from_metadata({"ss_sd_model_name": name}) is family


def test_the_refiners_longer_spelling_beats_sdxls():
    assert family_from_metadata({"modelspec.architecture": "stable-diffusion-xl-v1-refiner/lora"}) is Family.UNKNOWN
    assert family_from_metadata({"modelspec.architecture": "stable-diffusion-xl-v1-base/lora"}) is Family.SDXL
