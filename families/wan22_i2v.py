"""Wan 2.2 I2V-A14B's identity: image-to-video with two 14B Wan transformers, one for the high-noise steps and one
for the low-noise steps (`transformer`, `transformer_2`), each with Wan's blocks (`families.wan_names`), 5120 wide
as Wan 2.1 14B's. Unlike Wan 2.1's image-to-video model it has no CLIP image encoder and no image keys and values
in its cross-attention (the image enters as latents beside the noise only), so its LoRAs show Wan's block names
alone: a card, metadata ("wan2.2-i2v-a14b") or Civitai's label tells them from the other Wan bases'."""

from __future__ import annotations

import dataclasses

from families import wan22
from families.identity import Base, CivitaiLabel, Family, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "Wan-AI/Wan2.2-I2V-A14B-Diffusers"
TINY_ID = "tiny-wan22-i2v"
# Wan 2.2 T2V-A14B's identity by its differences (the same transformers' names, release and full differences).
IDENTITY = dataclasses.replace(
    wan22.IDENTITY,
    family=Family.WAN22_I2V,
    label="Wan 2.2 I2V A14B",
    bases=(Base(MODEL_ID, "Wan 2.2 I2V A14B"),),
    # musubi-tuner's ModelSpec architecture ("wan2.2-i2v-a14b"): longer than Wan's `wan2.2`, so it wins.
    spellings=Spellings(
        architectures=("wan2.2-i2v-a14b", "wan2.2_i2v_a14b", "wan22-i2v-a14b"),
        kohya_versions=("wan2.2-i2v-a14b", "wan2.2_i2v_a14b", "wan22_i2v_a14b"),
        checkpoint_names=r"wan[-_]?2[._]?2[-_]i2v[-_]a14b",
    ),
    civitai=(CivitaiLabel("Wan Video 2.2 I2V-A14B", MODEL_ID),),
    tiny_id=TINY_ID,
)
