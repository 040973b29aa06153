"""Qwen-Image-Edit-2509 and -2511's identity: Qwen's multi-image editing releases of Qwen-Image-Edit, which diffusers
runs with `QwenImageEditPlusPipeline` (one to three reference images, each seen by Qwen2.5-VL as "Picture N").
Their LoRAs have Qwen-Image's tensor names and widths, so only what they declare brings them here: a card's
`base_model` (the two bases), musubi-tuner's "Qwen-Image-Edit-Plus" / "Qwen-Image-Edit-2511" ModelSpec
architecture (its utils/sai_model_spec.py), a checkpoint name of either release. Civitai's one "Qwen" label stays
Qwen-Image's."""

from __future__ import annotations

from families.identity import Base, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "MODEL_ID_2511", "TINY_ID"]

MODEL_ID = "Qwen/Qwen-Image-Edit-2509"
MODEL_ID_2511 = "Qwen/Qwen-Image-Edit-2511"
TINY_ID = "tiny-qwen-image-edit-plus"
# Longer than Qwen-Image-Edit's "qwen-image-edit": the longest prefix wins (lora_catalog.bases).
_SPELLINGS = tuple(
    f"qwen{sep}image{sep}edit{sep}{release}" for sep in ("-", "_", "") for release in ("plus", "2509", "2511")
)


IDENTITY = FamilyIdentity(
    family=Family.QWEN_IMAGE_EDIT_PLUS,
    label="Qwen-Image-Edit-2509/2511",
    bases=(Base(MODEL_ID, "Qwen-Image-Edit-2509"), Base(MODEL_ID_2511, "Qwen-Image-Edit-2511")),
    # No claims: no tensor name is the Plus releases' alone (Qwen-Image's transformer): what a LoRA declares decides.
    spellings=Spellings(
        architectures=_SPELLINGS,
        kohya_versions=_SPELLINGS,
        checkpoint_names=r"qwen[-_]?image[-_]?edit[-_]?(plus|2509|2511)",
    ),
    # Newer than Qwen-Image-Edit: where a checkpoint name shows both ("qwen_image_edit_2509_bf16"), the more
    # specific spelling, then the newer architecture, wins (families.claims).
    released="2025-09",
    tiny_id=TINY_ID,
    # Their LoRAs fit Qwen-Image-Edit's transformer (the same keys and shapes): that pool runs them when no pool of
    # theirs is served, with a warning (single-image, without the Plus releases' own conditioning).
    falls_back_to=Family.QWEN_IMAGE_EDIT,
)
