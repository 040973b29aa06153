"""LTX-2 (Lightricks' LTX-2 19B and LTX-2.3): `LTX2Pipeline`, one DiT over video and audio tokens, conditioned on
Gemma 3's hidden states through the text connectors; a result is a video (`FamilySpec.video`: its frames, in
order) with its sound (`FamilySpec.audio_rate`: the vocoder's waveform, which the answer's MP4 carries). A pool
also makes a video from an image (image-to-video): diffusers' `LTX2ImageToVideoPipeline` over the pool's own
components (`from_pipe`: no weight loaded or copied).

A LoRA adapts the transformer and the connectors (`LTX2LoraLoaderMixin._lora_loadable_modules`), never Gemma; every
naming diffusers' `LTX2Pipeline.lora_state_dict` reads (diffusers/PEFT `transformer.` and `connectors.`, the
original trainer's `diffusion_model.` and `text_embedding_projection.`) is converted by its own converter.
Defaults are diffusers' (whose call follows LTX-2.3's card: cross timestep, spatio-temporal guidance, audio
guidance 7): 30 steps at CFG 3, 121 frames (8k+1: the VAE packs 8 frames in each latent frame after the first) at
24 fps, 768 x 512, sides in multiples of 32 (the VAE's spatial scale; the transformer's patches are 1x1). diffusers'
call never refuses a frame count (10 quietly gives 9): `engine.video_checks` refuses it first, by the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from diffusers import LTX2ImageToVideoPipeline, LTX2InContextPipeline, LTX2Pipeline
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

from engine.families.ltx2_memory import MEMORY, MEMORY_2_3
from engine.families.spec import (
    FamilySpec,
    LoraSignature,
    Module,
    Pipeline,
    PreviewSpec,
    RunDefaults,
    Shapes,
    Tensor,
    VideoDefaults,
    Widths,
    head_width,
    hidden_widths,
)
from engine.families.tiny_ltx2 import TINY_FRAMES, build_tiny_pipeline
from engine.requests import CheckedRequest, RequestMode
from engine.video_input import InputVideo
from families.ltx2 import IDENTITY, MODEL_ID, MODEL_ID_2_3, MODEL_ID_2_5

__all__ = ["FAMILY", "audio_rate", "convert_lora"]

# LTX-2's card size (768 x 512 both ways) and the square between them, at the 512 side.
SIDE = 512
SIZE_BUCKETS = ((768, 512), (512, 768), (640, 640))
# The card's clip: 121 frames at 24 fps (5 s); its longest, 20 s (diffusers' call's `max_seconds`; 481 frames at
# 24 fps), capped by MAX_VIDEO_FRAMES.
_FRAMES, _FPS, _MOST_FRAMES, _MOST_SECONDS = 121, 24, 481, 20.0
# The video self-attention's inputs, which take the video stream's width (`audio_attn1` is the audio's); the
# connectors' self-attention's, which take the text's (Gemma's width).
_HIDDEN_INPUT = re.compile(r"^(transformer\.|diffusion_model\.)?transformer_blocks\.\d+\.attn1\.to_[qkv]\.")
_TEXT_INPUT = re.compile(r"(video|audio)_connector\.transformer_blocks\.\d+\.attn1\.to_[qkv]\.")
_DOWN = (".lora_down.weight", ".lora_a.weight", ".lora_a.default.weight")
# The layers only some versions have, in diffusers' names and the original trainer's, and those versions (see
# `checkpoint`): 2.0's prompt projections, 2.3's prompt modulation, the per-modality connector projections of 2.3 and
# 2.5 (which LTX-2.5 also has: diffusers 0.42.1 modular_pipelines/ltx2/encoders.py:588 keeps the single projection
# for "the LTX-2.0 connector branch"). LTX-2.5 has no adaptable layer of its own (its `keyframes_abs_pos_embedding` is
# a parameter, no linear), so its tensors tell it from 2.0 but never from 2.3 unless a 2.3-only layer is there.
_VERSION_LAYERS = (
    (
        frozenset({MODEL_ID}),
        re.compile(
            r"^(transformer\.|diffusion_model\.)?(audio_)?caption_projection\."
            r"|^(connectors|text_embedding_projection)\.(text_proj_in|aggregate_embed)\."
        ),
    ),
    (frozenset({MODEL_ID_2_3}), re.compile(r"^(transformer\.|diffusion_model\.)?(audio_)?prompt_adaln(_single)?\.")),
    (
        frozenset({MODEL_ID_2_3, MODEL_ID_2_5}),
        re.compile(r"^(connectors|text_embedding_projection)\.(video|audio)_(text_proj_in|aggregate_embed)\."),
    ),
)
# diffusers' converter reports what it cannot read with these (and ValueError, which passes as it is).
_CONVERTER_ERRORS = (AssertionError, RuntimeError, KeyError, TypeError, AttributeError, IndexError)


def lora_widths(shapes: Shapes) -> Widths:
    """The video stream's width its self-attention factors take, and the text's its connectors' take."""
    return Widths(hidden_widths(shapes, _DOWN, _HIDDEN_INPUT), hidden_widths(shapes, _DOWN, _TEXT_INPUT))


def checkpoint(names: Iterable[str]) -> str | None:
    """The version a LoRA's tensor names show, by the layers only some versions have (diffusers 0.42.1,
    models/transformers/transformer_ltx2.py: `caption_projection` and `audio_caption_projection` are LTX-2.0's, whose
    later versions project the prompt in the connectors, `video_text_proj_in`/`audio_text_proj_in`, where 2.0 has one
    `text_proj_in`: pipelines/ltx2/connectors.py; `prompt_adaln` and `audio_prompt_adaln` are LTX-2.3's prompt
    modulation, which 2.5 drops, `use_prompt_adaln_single=False`). None: its layers leave more than one version (the
    attentions and feed-forwards: same names and widths in all three), or none."""
    versions: frozenset[str] | None = None
    for name in names:
        for has, layers in _VERSION_LAYERS:
            if layers.search(name.lower()):
                versions = has if versions is None else versions & has
    return next(iter(versions)) if versions is not None and len(versions) == 1 else None


def pipeline_widths(denoiser: Module, encoders: Mapping[str, Module]) -> Widths:
    """The transformer's video width (heads x head width) and the connectors' (Gemma's hidden width, which they
    keep); Gemma itself is never adapted."""
    connectors = encoders.get("connectors")
    text = frozenset() if connectors is None else frozenset({int(connectors.config.caption_channels)})
    return Widths(frozenset({head_width(denoiser)}), text)


def convert_lora(state_dict: dict[str, Tensor], denoiser: Module) -> tuple[dict[str, Tensor], Mapping[str, Any] | None]:
    """diffusers' own conversion (`LTX2Pipeline.lora_state_dict`: the original `diffusion_model.` names to the
    transformer's, `text_embedding_projection.` to the connectors'; diffusers/PEFT names as they are). Given a copy
    (diffusers pops what it converts). What diffusers cannot read comes out as a ValueError."""
    try:
        return LTX2Pipeline.lora_state_dict(dict(state_dict)), None
    except _CONVERTER_ERRORS as e:
        raise ValueError(f"diffusers' LTX-2 converter could not read it ({type(e).__name__}: {e})") from e


def _tiny(pipe: Pipeline) -> bool:
    return bool(getattr(pipe.vae.config, "sample_size", None))


def served_side(pipe: Pipeline) -> int:
    """The card's 512 short side; a tiny VAE's config states its own."""
    stated = getattr(pipe.vae.config, "sample_size", None)
    return int(stated) if stated else SIDE


def defaults(pipe: Pipeline) -> RunDefaults:
    """diffusers' call's: 30 steps at CFG 3, which reads the negative prompt; sides in the VAE's spatial scale times
    the transformer's patch."""
    side = int(pipe.vae_spatial_compression_ratio) * int(pipe.transformer_spatial_patch_size)
    return RunDefaults(30, 3.0, "cfg", negative_prompt=True, side_multiple=side)


def video(pipe: Pipeline) -> VideoDefaults:
    """121 frames at 24 fps, 8k+1 (the VAE's temporal scale), clips up to 20 s; a tiny VAE's pipeline makes 9."""
    frames = TINY_FRAMES if _tiny(pipe) else _FRAMES
    multiple = int(pipe.vae_temporal_compression_ratio) * int(pipe.transformer_temporal_patch_size)
    return VideoDefaults(
        num_frames=frames, fps=_FPS, max_frames=_MOST_FRAMES, frame_multiple=multiple, max_seconds=_MOST_SECONDS
    )


def audio_rate(pipe: Pipeline) -> int:
    """The waveform's samples a second: the vocoder's output rate (LTX-2's 24 kHz)."""
    return int(pipe.vocoder.config.output_sampling_rate)


def call_arguments(request: CheckedRequest) -> dict[str, Any]:
    """LTX2Pipeline's call, at the request's rate (the audio's length and the video's motion follow it); a request
    the engine makes itself (a warm-up) asks for one frame. With a reference video (an IC-LoRA's), the in-context
    pipeline's call: the video as its one reference condition, at diffusers' default strength, and an image with
    it as the first frame (`conditions`), as image-to-video takes it: the checked image at full strength, re-
    compressed at the model's default CRF (the in-context call takes no `image`)."""
    return {
        **_in_context_conditions(request),
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt or None,
        "guidance_scale": request.guidance,
        "num_inference_steps": request.steps,
        "width": request.width,
        "height": request.height,
        "num_frames": request.num_frames or 1,
        "frame_rate": float(request.fps or _FPS),
    }


def _in_context_conditions(request: CheckedRequest) -> dict[str, Any]:
    """The in-context call's conditions: none without a reference video; its image (if any) as frame 0; the
    request's `reference_strength` and `reference_downscale` as the call's own names."""
    if request.reference_video is None:
        return {}
    conditions: dict[str, Any] = {"reference_conditions": [_reference_condition(request.reference_video)]}
    # The request's own settings of the in-context call (None: diffusers' defaults, not passed).
    if request.reference_strength is not None:
        conditions["conditioning_attention_strength"] = request.reference_strength
    if request.reference_downscale is not None:
        conditions["reference_downscale_factor"] = request.reference_downscale
    if request.image is not None:
        # diffusers' defaults (strength 1, the model's CRF): what LTX2ImageToVideoPipeline does with its `image`.
        conditions["conditions"] = [LTX2VideoCondition(frames=request.image.to_pil(), index=0)]
    return conditions


def _reference_condition(video: InputVideo) -> LTX2ReferenceCondition:
    return LTX2ReferenceCondition(frames=[frame.to_pil() for frame in video.frames])


def pipeline_modes(pipe: Pipeline) -> tuple[RequestMode, ...]:
    """Text-to-video, and image-to-video (the image is the first frame) through LTX2ImageToVideoPipeline."""
    return ("text-to-image", "image-to-image")


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=LTX2Pipeline,
    denoiser="transformer",
    components=("transformer", "connectors"),
    side=SIDE,
    served_side=served_side,
    defaults=defaults,
    call_arguments=call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=convert_lora,
    signature=LoraSignature(lora_widths, pipeline_widths, checkpoint=checkpoint),
    # No linear projection of LTX-2's 128 latent channels is published: no live preview.
    preview=PreviewSpec(None, None),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    # LTX-2.5's transformer is 22 B as 2.3's (Lightricks' "LTX-2.5-22b" IC-LoRA repos).
    base_memory=((MODEL_ID_2_3, MEMORY_2_3), (MODEL_ID_2_5, MEMORY_2_3)),
    video=video,
    image_to_image=LTX2ImageToVideoPipeline,
    in_context=LTX2InContextPipeline,
    pipeline_modes=pipeline_modes,
    audio_rate=audio_rate,
)
