"""Parts of Wan 2.1's 16-channel VAE that other families reuse: Qwen-Image's VAE keeps Wan 2.1's latent space
(ComfyUI previews both with its one `Wan21` latent format), and Krea 2 decodes with Qwen-Image's. Kept apart from
`engine.families.wan` so that a family reusing them imports no other family's spec (as `bfl_parts` for FLUX.1's).
"""

from __future__ import annotations

from engine.families.spec import LatentProjection

__all__ = ["LATENT_RGB"]

# ComfyUI, comfy/latent_formats.py, class Wan21 (latent_rgb_factors, latent_rgb_factors_bias): fitted on the
# normalised latents ((z - mean) / std), the space WanPipeline denoises in and QwenImagePipeline and Krea2Pipeline
# hand their per-step callbacks.
LATENT_RGB = LatentProjection(
    weights=(
        (-0.1299, -0.1692, 0.2932),
        (0.0671, 0.0406, 0.0442),
        (0.3568, 0.2548, 0.1747),
        (0.0372, 0.2344, 0.1420),
        (0.0313, 0.0189, -0.0328),
        (0.0296, -0.0956, -0.0665),
        (-0.3477, -0.4059, -0.2925),
        (0.0166, 0.1902, 0.1975),
        (-0.0412, 0.0267, -0.1364),
        (-0.1293, 0.0740, 0.1636),
        (0.0680, 0.3019, 0.1128),
        (0.0032, 0.0581, 0.0639),
        (-0.1251, 0.0927, 0.1699),
        (0.0060, -0.0633, 0.0005),
        (0.3477, 0.2275, 0.2950),
        (0.1984, 0.0913, 0.1861),
    ),
    bias=(-0.1835, -0.0868, -0.3360),
)
