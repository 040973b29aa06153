"""Wan 2.2 I2V-A14B: `WanImageToVideoPipeline` with two transformers, `transformer` for the high-noise steps and
`transformer_2` for the low-noise ones, switched at the pipeline's `boundary_ratio` (0.9 of the timesteps). Every
request brings its image (the first frame: `needs_image`); the model has no CLIP image encoder (the image enters
as VAE latents beside the noise only), so nothing but the two transformers is adapted, never UMT5.

LoRAs as Wan 2.2 T2V-A14B's (`engine.families.wan22`): Wan's names through diffusers' own converter, a single file
on both transformers at the request's `scale` (high-noise) and `scale_2` (low-noise), a high-noise/low-noise pair
of files as one LoRA, each file on its transformer (`stage_of`: the file's name or metadata), as diffusers loads
them (`load_lora_weights`, and `load_into_transformer_2=True` for the low-noise side).
Defaults as Wan's I2V-A14B config runs it (configs/wan_i2v_A14B.py): 40 steps, CFG 3.5 on both stages, 81 frames
at 16 fps.
"""

from __future__ import annotations

import dataclasses
import functools

from diffusers import WanImageToVideoPipeline

from engine.families import wan, wan22
from engine.families.spec import Pipeline, RunDefaults, VideoDefaults
from engine.families.tiny_wan import build_tiny_a14b_pipeline
from engine.families.wan_memory import MEMORY_I2V_A14B
from families.wan22_i2v import IDENTITY

__all__ = ["FAMILY"]


def defaults(pipe: Pipeline) -> RunDefaults:
    """Wan's I2V-A14B config: 40 steps at CFG 3.5 (the high-noise stage's)."""
    return RunDefaults(40, 3.5, "cfg", negative_prompt=True, side_multiple=2 * int(pipe.vae_scale_factor_spatial))


def video(pipe: Pipeline) -> VideoDefaults:
    """Wan's frames, and the low-noise stage's guidance 3.5."""
    return VideoDefaults(**{**vars(wan.video(pipe)), "guidance_2": 3.5})


# Wan 2.2 T2V-A14B's spec, by its differences: its pipeline, defaults and tiny model, its sizes, an image on
# every request.
FAMILY = dataclasses.replace(
    wan22.FAMILY,
    identity=IDENTITY,
    pipeline_class=WanImageToVideoPipeline,
    defaults=defaults,
    build_tiny=functools.partial(build_tiny_a14b_pipeline, image=True),
    memory=MEMORY_I2V_A14B,
    needs_image=True,
    video=video,
)
