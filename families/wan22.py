"""Wan 2.2 T2V-A14B's identity: two 14B Wan transformers, one for the high-noise steps and one for the low-noise
steps (`transformer`, `transformer_2`), each with Wan's blocks (`families.wan_names`), 5120 wide as Wan 2.1 14B's.
Its LoRAs show Wan's names; a card, metadata ("wan2.2-t2v-a14b") or Civitai's label tells them from Wan 2.1's."""

from __future__ import annotations

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings
from families.wan_names import claims

__all__ = ["IDENTITY", "MODEL_ID", "TINY_ID"]

MODEL_ID = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
TINY_ID = "tiny-wan22"
IDENTITY = FamilyIdentity(
    family=Family.WAN22,
    label="Wan 2.2 A14B",
    bases=(Base(MODEL_ID, "Wan 2.2 T2V A14B"),),
    # musubi-tuner's ModelSpec architecture ("wan2.2-t2v-a14b"): longer than Wan's `wan2.2`, so it wins.
    spellings=Spellings(
        architectures=("wan2.2-t2v-a14b", "wan2.2_t2v_a14b", "wan22-a14b"),
        kohya_versions=("wan2.2-t2v-a14b", "wan2.2_t2v_a14b", "wan22_a14b"),
        checkpoint_names=r"wan[-_]?2[._]?2[-_]t2v[-_]a14b",
    ),
    claims=Claims(names=claims),
    released="2025-07",
    civitai=(CivitaiLabel("Wan Video 2.2 T2V-A14B", MODEL_ID),),
    tiny_id=TINY_ID,
    # lightx2v's speed LoRAs' norm `.diff` and kijai's `.diff_m` (modulation) apply (`engine.families.wan`).
    full_differences=True,
    two_stage=True,
)
