"""Parts of BFL's FLUX.1 that other families reuse: its 16-channel VAE (Z-Image decodes with it too) and that VAE's
live-preview decoders, and the aspect buckets around a megapixel BFL trains on (FLUX.2's too). Kept apart from
`engine.families.flux` so that a family reusing them imports no other family's spec.
"""

from __future__ import annotations

from typing import Any

from engine.families.spec import LatentProjection

__all__ = ["LATENT_RGB", "SIZE_BUCKETS", "TAEF1", "VAE"]

# FLUX.1 is trained on many aspect ratios around a megapixel; these are the common ones (multiples of 64).
SIZE_BUCKETS = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344))
# The distilled decoder of FLUX.1's VAE (diffusers' AutoencoderTiny).
TAEF1 = "madebyollin/taef1"
# ComfyUI, comfy/latent_formats.py, class Flux (latent_rgb_factors, latent_rgb_factors_bias): fitted on the
# diffusion-space latents (after FLUX's VAE shift and scale), the space FluxPipeline hands its per-step callback.
LATENT_RGB = LatentProjection(
    weights=(
        (-0.0346, 0.0244, 0.0681),
        (0.0034, 0.0210, 0.0687),
        (0.0275, -0.0668, -0.0433),
        (-0.0174, 0.0160, 0.0617),
        (0.0859, 0.0721, 0.0329),
        (0.0004, 0.0383, 0.0115),
        (0.0405, 0.0861, 0.0915),
        (-0.0236, -0.0185, -0.0259),
        (-0.0245, 0.0250, 0.1180),
        (0.1008, 0.0755, -0.0421),
        (-0.0515, 0.0201, 0.0011),
        (0.0428, -0.0012, -0.0036),
        (0.0817, 0.0765, 0.0749),
        (-0.1264, -0.0522, -0.1103),
        (-0.0280, -0.0881, -0.0499),
        (-0.1262, -0.0982, -0.0778),
    ),
    bias=(-0.0329, -0.0718, -0.0851),
)
# FLUX's VAE, where it differs from the tiny one's: 16 latent channels, no quant convolutions, and its
# scaling and shift factors (the diffusion-space latents are (z - 0.1159) * 0.3611).
VAE: dict[str, Any] = {
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
}
