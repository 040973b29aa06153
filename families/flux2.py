"""FLUX.2 [klein]'s identity (4B and 9B, distilled and base): FLUX.2's transformer names it (`families.flux2_names`:
its own layers, and the blocks it shares with FLUX.1, whose shapes then decide)."""

from __future__ import annotations

from families.flux2_names import own_name, shared_name
from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["BASE_4B", "BASE_9B", "IDENTITY", "MODEL_ID", "MODEL_ID_9B", "TINY_ID"]

# The distilled models (4 steps, no guidance) and their undistilled bases, as BFL and diffusers name them.
MODEL_ID = "black-forest-labs/FLUX.2-klein-4B"
MODEL_ID_9B = "black-forest-labs/FLUX.2-klein-9B"
BASE_4B = "black-forest-labs/FLUX.2-klein-base-4B"
BASE_9B = "black-forest-labs/FLUX.2-klein-base-9B"
TINY_ID = "tiny-flux2"
IDENTITY = FamilyIdentity(
    family=Family.FLUX2,
    label="FLUX.2 [klein]",
    bases=(
        Base(MODEL_ID, "FLUX.2 [klein] 4B"),
        Base(MODEL_ID_9B, "FLUX.2 [klein] 9B"),
        Base(BASE_4B, "FLUX.2 [klein] base 4B"),
        Base(BASE_9B, "FLUX.2 [klein] base 9B"),
    ),
    # Trainers spell FLUX.2 with or without a separator (musubi-tuner's `flux_2`, ai-toolkit's `flux2`); the
    # longest prefix wins over FLUX.1's `flux`.
    spellings=Spellings(
        architectures=("flux-2", "flux.2", "flux_2", "flux2"),
        kohya_versions=("flux-2", "flux.2", "flux_2", "flux2"),
        checkpoint_names=r"flux[-_.]?2|klein",
    ),
    # The catalogue labels a file klein's by FLUX.2's own layers (the default FLUX.2 model, as on Civitai).
    claims=Claims(names=shared_name, own=own_name, labels=own_name),
    released="2026-01",
    # Civitai's labels for klein (its default FLUX.2 model); "Flux.2 D" is FLUX.2 [dev]'s (families/flux2_dev.py).
    civitai=(
        CivitaiLabel("Flux.2 Klein 4B", MODEL_ID),
        CivitaiLabel("Flux.2 Klein 9B", MODEL_ID_9B),
        CivitaiLabel("Flux.2 Klein 4B-base", BASE_4B),
        CivitaiLabel("Flux.2 Klein 9B-base", BASE_9B),
    ),
    tiny_id=TINY_ID,
    demo_later="off",
)
