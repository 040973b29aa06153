"""The claims table's resolver (`families.claims`): each family's row holds its own signs, the ranking is one."""

from __future__ import annotations

from families import IDENTITIES, Family
from families.claims import TensorMatch, family_from_checkpoint_name, label_from_names, name_counts, rank_by_tensors
from families.flux import claims as flux1_names

FLUX2_OWN = "transformer.single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A.weight"
BFL_SHARED = "diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight"


def test_a_name_a_row_declares_its_own_counts_only_for_the_rows_declaring_it_so():
    # FLUX.1's row claims every single-block name (its own terms), FLUX.2's declare the fused projection theirs.
    assert flux1_names(FLUX2_OWN.lower())
    counts = name_counts([FLUX2_OWN, BFL_SHARED], IDENTITIES.values())
    assert counts[Family.FLUX2] == counts[Family.FLUX2_DEV] == 2
    assert counts[Family.FLUX] == 1
    assert counts[Family.QWEN_IMAGE] == counts[Family.SDXL] == 0


def test_rows_that_declare_no_names_are_never_claimed_by_names():
    counts = name_counts(
        [FLUX2_OWN, BFL_SHARED, "transformer_blocks.0.img_mlp.net.0.proj.lora_A.weight"], IDENTITIES.values()
    )
    assert counts[Family.FLUX_KONTEXT] == counts[Family.QWEN_IMAGE_EDIT] == 0


def test_shapes_and_declared_widths_rule_out_then_most_names_then_declared_widths():
    klein, dev, flux = Family.FLUX2, Family.FLUX2_DEV, Family.FLUX
    # [dev]'s widths hold the LoRA's: it beats klein, which declares none, at equal names.
    assert rank_by_tensors([TensorMatch(klein, 5), TensorMatch(dev, 5, widths=True)]) == (dev,)
    # [dev]'s widths exclude them: it is out, whatever its names.
    assert rank_by_tensors([TensorMatch(klein, 5), TensorMatch(dev, 5, widths=False)]) == (klein,)
    # A family whose own shape rule rules the LoRA out is out before names are counted.
    assert rank_by_tensors([TensorMatch(flux, 9, ruled_out=True), TensorMatch(klein, 5)]) == (klein,)
    # Equal names and nothing declared: both stay, for the pools' routing to break the tie.
    assert rank_by_tensors([TensorMatch(flux, 5), TensorMatch(klein, 5)]) == (flux, klein)
    assert rank_by_tensors([TensorMatch(flux, 0), TensorMatch(klein, 0)]) == ()


def test_labels_go_to_the_newest_architecture_whose_row_labels_by_the_names():
    assert label_from_names([BFL_SHARED]) is Family.FLUX
    assert label_from_names([BFL_SHARED, FLUX2_OWN]) is Family.FLUX2
    assert (
        label_from_names(["lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", BFL_SHARED]) is Family.FLUX
    )
    # SD 2.x's row labels by no name: the names it shares with SD 1.x are labelled SD 1.5.
    assert label_from_names(["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"]) is Family.SD15
    assert label_from_names([]) is None


def test_a_checkpoint_spelling_holding_anothers_is_the_more_specific():
    assert family_from_checkpoint_name("flux-2-dev-fp8.safetensors") is Family.FLUX2_DEV
    assert family_from_checkpoint_name("flux-2-klein-9b.safetensors") is Family.FLUX2
    assert family_from_checkpoint_name("flux1-dev.safetensors") is Family.FLUX
    assert family_from_checkpoint_name("qwen_image_bf16.safetensors") is Family.QWEN_IMAGE
    assert family_from_checkpoint_name("model.ckpt") is None
