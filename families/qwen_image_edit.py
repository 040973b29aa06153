"""Qwen-Image-Edit's identity: Qwen's instruction-editing Qwen-Image (the same 20 B transformer reading an input
image's latents beside the output's, its Qwen2.5-VL encoder seeing the image too). Its LoRAs have Qwen-Image's
tensor names and widths (and so do those of its 2509 and 2511 releases: one transformer, further trained), so
they are told apart by what they declare (a card's `base_model`, musubi-tuner's "Qwen-Image-Edit" ModelSpec
metadata), never by their names. Civitai files both under its one "Qwen" label, which stays Qwen-Image's."""

from __future__ import annotations

from families.identity import Base, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "Qwen/Qwen-Image-Edit"
TINY_ID = "tiny-qwen-image-edit"


IDENTITY = FamilyIdentity(
    family=Family.QWEN_IMAGE_EDIT,
    label="Qwen-Image-Edit",
    bases=(Base(MODEL_ID, "Qwen-Image-Edit"),),
    # No claims: no tensor name is Qwen-Image-Edit's alone, so a LoRA that declares nothing is judged by names.
    # Cards naming Qwen's later edit releases (Qwen/Qwen-Image-Edit-2509, -2511): their LoRAs fit this transformer.
    series=("qwen/qwen-image-edit",),
    # Longer than Qwen-Image's "qwen-image": the longest prefix wins (lora_catalog.bases). musubi-tuner writes
    # "Qwen-Image-Edit", "Qwen-Image-Edit-Plus" and "Qwen-Image-Edit-2511" (its utils/sai_model_spec.py).
    spellings=Spellings(
        architectures=("qwen-image-edit", "qwen_image_edit", "qwenimageedit"),
        kohya_versions=("qwen-image-edit", "qwen_image_edit", "qwenimageedit"),
        checkpoint_names=r"qwen[-_]?image[-_]?edit",
    ),
    released="2025-08",
    tiny_id=TINY_ID,
)
