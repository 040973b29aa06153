"""Wan 2.1 image-to-video's identity (14B at 480P and 720P): Wan's blocks (`families.wan_names`), and its own
layers, the cross-attention's image keys and values and the image embedder (`k_img`, `v_img`, `img_emb`; diffusers'
`add_k_proj`, `add_v_proj`, `image_embedder`), which only its LoRAs have. A text-to-video Wan LoRA has none of
them: it runs here too (diffusers expands it with zeros for those layers), where the pools' routing sends it."""

from __future__ import annotations

import dataclasses

from families import wan
from families.identity import Base, CivitaiLabel, Claims, Family, Spellings
from families.wan_names import claims, image_to_video_name

__all__ = ["IDENTITY", "MODEL_ID", "MODEL_ID_720P", "TINY_ID"]

MODEL_ID = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
MODEL_ID_720P = "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers"
TINY_ID = "tiny-wan-i2v"
# Wan's identity by its differences (its release and full differences are Wan's).
IDENTITY = dataclasses.replace(
    wan.IDENTITY,
    family=Family.WAN_I2V,
    label="Wan I2V",
    bases=(Base(MODEL_ID, "Wan 2.1 I2V 14B 480P"), Base(MODEL_ID_720P, "Wan 2.1 I2V 14B 720P")),
    # musubi-tuner's ModelSpec architecture ("wan2.1-i2v-14b"): longer than Wan's own prefixes, so it wins.
    spellings=Spellings(
        architectures=("wan2.1-i2v", "wan2.1_i2v", "wan-i2v", "wan_i2v"),
        kohya_versions=("wan2.1-i2v", "wan2.1_i2v", "wan_i2v"),
        checkpoint_names=r"wan[-_]?2[._]?1[-_]i2v",
    ),
    # Wan's block names, and the image layers as its own: an image-to-video LoRA outnumbers Wan's claim.
    claims=Claims(names=claims, own=image_to_video_name, labels=image_to_video_name),
    civitai=(CivitaiLabel("Wan Video 14B i2v 480p", MODEL_ID), CivitaiLabel("Wan Video 14B i2v 720p", MODEL_ID_720P)),
    tiny_id=TINY_ID,
    demo_later=None,  # the offline demo's video pool is Wan's text-to-video one
    # Wan 2.2 I2V-A14B's transformers are Wan 2.1 14B's blocks without the image keys and values: people run 2.1
    # image-to-video LoRAs on them. Allowed there with a warning where no Wan 2.1 I2V pool is served (or the request
    # names the A14B pool); the image layers' factors fit no layer there and are dropped, as diffusers drops them.
    falls_back_to=Family.WAN22_I2V,
)
