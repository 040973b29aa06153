"""FLUX.2 [dev] (32 B): `Flux2Pipeline`, klein's transformer architecture at 6144 wide with a guidance embedding, and
Mistral Small 3.1 (24 B) as its text encoder, 1024 px.

A LoRA adapts the transformer only; its namings are klein's (`Flux2LoraLoaderMixin`, one converter for both:
`engine.families.flux2.convert_lora`, whose checks of what diffusers would drop hold here too). Told from klein's
LoRAs by the hidden width its factors show (6144: `WIDTHS`, its row's widths), else by what it declares.
Defaults are diffusers' `Flux2Pipeline.__call__`'s and BFL's model card's: 50 steps at a distilled guidance of 4
(one pass per step, no negative prompt; the card names 28 steps a fair trade-off). Previews are klein's (the same
VAE and packed latents). A request with an image is a reference edit on the pool's own pipeline
(`Flux2Pipeline`'s `image=[...]`): the image and up to 5 further `images`, BFL's recommended most for [dev];
diffusers 0.42 has no FLUX.2 [dev] image-to-image or inpainting class. Mistral stays in host RAM where the GPU is short,
and its transformer in fp8 (`QUANTIZE`) makes it fit 80 GB with its encoder on the GPU (tests/engine/pools).
"""

from __future__ import annotations

from diffusers import Flux2Pipeline
from transformers import AutoTokenizer

from engine.families import flux2
from engine.families.bfl_parts import SIZE_BUCKETS
from engine.families.flux2_dev_tiny import TINY_WIDTH, build_tiny_pipeline
from engine.families.spec import FamilySpec, LoraSignature, MemorySpec, Pipeline, PreviewSpec, RunDefaults
from engine.storage import LinearSizes
from families.flux2_dev import IDENTITY

__all__ = ["FAMILY", "MEMORY", "WIDTHS", "defaults", "tokenizer_without_torchvision"]

# Parameter and buffer values as diffusers builds the transformer (its Flux2Transformer2DModel defaults are
# [dev]'s: 8 double and 48 single blocks 6144 wide) and the VAE, checked on the meta device
# (tests/engine/pools/test_plan_flux2.py); about 112.6 GB in bf16 with the encoder.
MEMORY = MemorySpec(
    values=(
        ("transformer", 32_223_281_152),
        # Mistral Small 3.1's stated 24 B (its vision tower included), not rebuilt here.
        ("text_encoder", 24_000_000_000),
        ("vae", 84_046_372),
    ),
    host_components=("text_encoder",),
    # Each single block's fused projection, 6144 to q, k, v and the SwiGLU's input (9 x 6144).
    largest_values=339_738_624,
    # fp8 storage (engine.storage): its Linears' weight values, output rows and in + out widths, LoRA branches on
    # every Linear of the transformer.
    linears=LinearSizes(32_223_264_768, 4_171_904, 6_491_904),
)


# FLUX.2 [dev] is one model, 6144 wide (48 heads of 128: black-forest-labs/FLUX.2-dev's transformer config, and
# diffusers' Flux2Transformer2DModel defaults); its tiny stand-in has a width of its own, as each tiny pipeline
# does, so the tiny pools tell apart as the real ones do. A LoRA of FLUX.2's names at these widths is [dev]'s.
WIDTHS = frozenset({6144, TINY_WIDTH})


def defaults(pipe: Pipeline) -> RunDefaults:
    """50 steps at a distilled guidance of 4 (diffusers' call and BFL's card); sides in the VAE's scale times the
    2x2 patches."""
    multiple = 2 * int(pipe.vae_scale_factor)
    fit = flux2.reference_fit(pipe)
    return RunDefaults(50, 4.0, "distilled", negative_prompt=False, side_multiple=multiple, reference_fit=fit)


def tokenizer_without_torchvision(model_id: str, token: str | None) -> dict[str, object]:
    """The `tokenizer` component, where transformers cannot import Mistral's `PixtralProcessor` (it imports
    torchvision, which this Space does not install): the processor's tokenizer alone, which is all the pipeline's
    text-to-image prompt encoding calls (`apply_chat_template` on text). With torchvision, diffusers loads the
    processor itself."""
    try:
        import transformers.models.pixtral.processing_pixtral  # noqa: F401
    except ImportError:
        return {"tokenizer": AutoTokenizer.from_pretrained(model_id, subfolder="tokenizer", token=token)}
    return {}


FAMILY = FamilySpec(
    identity=IDENTITY,
    pipeline_class=Flux2Pipeline,
    denoiser="transformer",
    components=("transformer",),
    side=1024,
    served_side=flux2.served_side,
    defaults=defaults,
    # klein's call: no negative prompt, `guidance_scale` (here the guidance embedding's value).
    call_arguments=flux2.call_arguments,
    size_buckets=SIZE_BUCKETS,
    convert_lora=flux2.convert_lora,
    signature=LoraSignature(flux2.lora_widths, flux2.pipeline_widths, flux2.rules_out, widths=WIDTHS),
    preview=PreviewSpec(None, flux2.LATENT_RGB, unpack=flux2.unpack_latents),
    build_tiny=build_tiny_pipeline,
    half_dtype="bfloat16",
    memory=MEMORY,
    # Its own pipeline edits from references (`image=[...]`): BFL recommends at most 6 for [dev].
    image_to_image=Flux2Pipeline,
    max_reference_images=6,
    load_components=tokenizer_without_torchvision,
)
