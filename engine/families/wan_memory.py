"""The Wan families' sizes for the start-up memory plan (`MemorySpec`), and the working memory of a video step and
of the VAE decode, from the latent shape.

Values: parameters and buffers as diffusers and transformers build each model from its published configs
(transformer/ `WanTransformer3DModel`; text_encoder/ UMT5-XXL's encoder; vae/ `AutoencoderKLWan`, Wan 2.1's for
every model but TI2V-5B's 48-channel Wan 2.2 VAE; image_encoder/ the I2V models' CLIP ViT-H/14), checked on the
meta device (tests/engine/pools/test_plan_wan.py). UMT5 (5.7 B values, 11.4 GB in bf16) is never adapted and may
run from host RAM. Wan 2.2 T2V-A14B keeps both 14B transformers resident (57 GB in bf16; in fp8 with branches at
rank 128 about 15.5 GB each, 31 GB both, which an L40S holds beside the VAE and a 720P step's working memory):
diffusers' pipeline switches between them at every video's boundary step, and taking turns there would move
28.6 GB (bf16; 15.5 GB fp8) over PCIe twice a video (about 2.3 s, 1.2 s in fp8, at 25 GB/s pinned), which the
pool's residency does not do within a pool. A quantized A14B pool stores both transformers quantized.

Working memory (what a run needs free beside the weights), from the latent shape: a video of n frames (4k+1) at
W x H has (n - 1) / 4 + 1 latent frames of (H / s) x (W / s), s the VAE's spatial factor (8; Wan 2.2's VAE 16),
and the transformer sees them in 1x2x2 patches: tokens = latent frames x (H / 2s) x (W / 2s) (diffusers'
`WanPipeline.prepare_latents` and `WanTransformer3DModel.patch_size`). A step (CFG runs the two branches one after
the other in diffusers' call, batch 1) peaks in a block's feed-forward: its ffn-wide input and GELU output in
bf16 (2 x 2 x ffn bytes a token) beside the hidden states' float32 copies the block keeps around its norms and
gates (4 x 4 x width). The VAE decodes causally, one latent frame (4 video frames) at a time: its peak is at the
decoder's full-resolution stage, about 6 bf16 tensors of 4 frames x its channels (the causal convolutions' cached
frames, the residual's input, norm and activation), beside the decoded video in float32. Declared, not measured
here (no GPU): `python -m bench.cuda_confirm wan_step` measures both against this figure.

Each base's pools take what its plan is sized for (`VideoPlan`, one declaration per base): a video of at most the
tokens of its card's size (`MemorySpec.video_size`: 81 x 832 x 480 at 480P, 81 x 1280 x 720 at 720P, TI2V-5B's
121 x 1280 x 704), which `engine.video_checks` holds every request to, with sides up to its largest
(`MemorySpec.largest_side`: 1280 on the 720P bases, twice the 480 side on the 480P ones, TI2V-5B's twice 704).
Its working memory is the most any such video needs: the step's peak grows with the tokens, so it is at most the
card size's; the decode's grows with the pixels of a frame, so a square of the largest side at the frames the
tokens leave it needs more than the card's size where the decode outweighs the step (1.3B: 2.2 GB at 81 x 832 x
480, 4.6 GB at 33 x 960 x 960; TI2V-5B: 4.1 and 7.4 GB; I2V-480P: 4.5 and 4.6 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.families.spec import MemorySpec
from engine.storage import LinearSizes
from engine.video_checks import latent_tokens

__all__ = [
    "MEMORY_1_3B",
    "MEMORY_5B",
    "MEMORY_14B",
    "MEMORY_A14B",
    "MEMORY_I2V_480P",
    "MEMORY_I2V_720P",
    "MEMORY_I2V_A14B",
    "VideoPlan",
    "VideoShape",
    "admitted_bytes",
    "decode_bytes",
    "midpass_bytes",
    "step_bytes",
    "video_tokens",
]

_BF16, _F32 = 2, 4
# UMT5-XXL's encoder (google/umt5-xxl, as Wan's text_encoder/), Wan 2.1's VAE and Wan 2.2's, the I2V CLIP.
UMT5_VALUES = 5_680_910_336
VAE_21_VALUES = 126_892_531
VAE_22_VALUES = 704_688_668
CLIP_VALUES = 632_077_057
# The VAE decoder's channels at its full-resolution stage and that stage's scale (Wan 2.2's unpatchifies 2x2).
_DECODER_TOP = {8: (96, 1), 16: (256, 2)}
_CHUNK_FRAMES, _DECODE_TENSORS = 4, 6
# Video frames a latent frame packs after the first (`VideoDefaults.frame_multiple`).
_FRAME_GROUP = 4


@dataclass(frozen=True)
class VideoShape:
    """A transformer's widths (its attention heads' too: 128 on every Wan) and the VAE's spatial factor: what the
    working memory depends on."""

    width: int
    ffn: int
    vae_scale: int = 8
    head: int = 128


def video_tokens(shape: VideoShape, frames: int, width: int, height: int) -> int:
    """The transformer's tokens for `frames` frames at `width` x `height` (module docstring): the count a request
    is checked by (`engine.video_checks.latent_tokens`), in 2x2 patches of the VAE's scale."""
    return latent_tokens(frames, width, height, _FRAME_GROUP, 2 * shape.vae_scale)


def step_bytes(shape: VideoShape, frames: int, width: int, height: int) -> int:
    """A denoising step's peak above the weights (module docstring)."""
    per_token = 2 * _BF16 * shape.ffn + 4 * _F32 * shape.width
    return video_tokens(shape, frames, width, height) * per_token


def decode_bytes(shape: VideoShape, frames: int, width: int, height: int) -> int:
    """The VAE decode's peak above the weights (module docstring)."""
    channels, scale = _DECODER_TOP[shape.vae_scale]
    stage = _CHUNK_FRAMES * (height // scale) * (width // scale) * channels * _BF16
    return _DECODE_TENSORS * stage + frames * 3 * height * width * _F32


def midpass_bytes(shape: VideoShape, frames: int, width: int, height: int) -> int:
    """What a run paused between two of its transformer's blocks keeps beside its latents (step sharing's pieces
    inside a pass: `FamilySpec.denoiser_blocks`): the hidden states the next block takes, a token's `width` in
    bf16 (diffusers' `WanTransformerBlock` hands them on in the compute dtype), and the rotary embeddings the
    forward made before its blocks, a token's `head` as float32 cosines and sines. Counted from the tokens, as
    the working memory is: the block's own activations are freed at its end."""
    return video_tokens(shape, frames, width, height) * (_BF16 * shape.width + 2 * _F32 * shape.head)


def working_bytes(shape: VideoShape, frames: int, width: int, height: int) -> int:
    """What a run at this size needs free beside the weights: its step or its decode, whichever is larger."""
    return max(step_bytes(shape, frames, width, height), decode_bytes(shape, frames, width, height))


def admitted_bytes(shape: VideoShape, size: tuple[int, int, int], largest_side: int) -> int:
    """The most working memory a video of at most `size`'s tokens needs at sides up to `largest_side` (module
    docstring): each width and height, in the patches' multiples, at the most frames the tokens leave it."""
    cell, budget = 2 * shape.vae_scale, video_tokens(shape, *size)
    most = working_bytes(shape, *size)
    for width in range(cell, largest_side + 1, cell):
        # Both figures are symmetric in width and height.
        for height in range(cell, width + 1, cell):
            latent = budget // ((width // cell) * (height // cell))
            if latent:
                most = max(most, working_bytes(shape, _FRAME_GROUP * (latent - 1) + 1, width, height))
    return most


@dataclass(frozen=True)
class VideoPlan:
    """A base's videos: the transformer and VAE shapes, the size (frames, width, height) its plan is made for
    (its card's), and the largest side its pools take."""

    shape: VideoShape
    size: tuple[int, int, int]
    largest_side: int


SHAPE_1_3B = VideoShape(1536, 8960)
SHAPE_5B = VideoShape(3072, 14336, vae_scale=16)
SHAPE_14B = VideoShape(5120, 13824)
# The sizes each base is planned at: its card's (480P, 720P; TI2V-5B: 121 frames at 1280 x 704), and its largest
# side: the 720P card's long side, else twice the short side (Wan's 480, TI2V-5B's 704), as every family's.
SIZE_480P, SIZE_720P, SIZE_5B = (81, 832, 480), (81, 1280, 720), (121, 1280, 704)
PLAN_1_3B = VideoPlan(SHAPE_1_3B, SIZE_480P, 2 * 480)
PLAN_14B_480P = VideoPlan(SHAPE_14B, SIZE_480P, 2 * 480)
PLAN_14B_720P = VideoPlan(SHAPE_14B, SIZE_720P, 1280)
PLAN_5B = VideoPlan(SHAPE_5B, SIZE_5B, 2 * 704)


def _memory(transformer: int, vae: int, plan: VideoPlan, linears: LinearSizes, largest: int) -> MemorySpec:
    return MemorySpec(
        values=(("transformer", transformer), ("text_encoder", UMT5_VALUES), ("vae", vae)),
        host_components=("text_encoder",),
        working_bytes=admitted_bytes(plan.shape, plan.size, plan.largest_side),
        # The time projection, width to 6 x width.
        largest_values=largest,
        linears=linears,
        video_size=plan.size,
        largest_side=plan.largest_side,
        midpass_bytes=midpass_bytes(plan.shape, *plan.size),
    )


# Wan2.1-T2V-1.3B: 30 blocks 1536 wide; planned at 480P, its card's only size.
MEMORY_1_3B = _memory(
    1_419_258_944, VAE_21_VALUES, PLAN_1_3B, LinearSizes(1_417_641_984, 698_944, 1_392_960), 14_155_776
)
# Wan2.1-T2V-14B: 40 blocks 5120 wide (diffusers' defaults); planned at 720P, its card's larger size.
# (Its Linears, which Wan 2.2 A14B's transformers share: the image latents' channels are a convolution's.)
_LINEARS_14B = LinearSizes(14_283_243_520, 2_447_424, 4_868_416)
MEMORY_14B = _memory(14_288_753_728, VAE_21_VALUES, PLAN_14B_720P, _LINEARS_14B, 157_286_400)
# Wan2.2-TI2V-5B: 30 blocks 3072 wide over the 48-channel latents of Wan 2.2's VAE.
MEMORY_5B = _memory(5_000_049_856, VAE_22_VALUES, PLAN_5B, LinearSizes(4_996_792_320, 1_290_432, 2_566_592), 56_623_104)
_I2V_LINEARS = LinearSizes(16_388_587_520, 2_863_424, 5_696_576)


def _i2v(plan: VideoPlan) -> MemorySpec:
    """Wan2.1-I2V-14B: the 14B transformer with the image projections (36 input channels), and CLIP ViT-H/14."""
    base = _memory(16_395_140_928, VAE_21_VALUES, plan, _I2V_LINEARS, 157_286_400)
    return MemorySpec(**{**vars(base), "values": (*base.values, ("image_encoder", CLIP_VALUES))})


MEMORY_I2V_480P = _i2v(PLAN_14B_480P)
MEMORY_I2V_720P = _i2v(PLAN_14B_720P)
# Wan2.2-T2V-A14B: two 14B transformers, both resident. A quantized pool stores both (`FamilySpec.stored`), so
# `linears` declares both transformers' Linears; nothing else takes LoRAs (Wan's do not adapt UMT5), so no fused
# swap's scratch is left on a quantized pool (`largest_encoder_values` 0).
_BOTH_14B_LINEARS = LinearSizes(*(2 * n for n in vars(_LINEARS_14B).values()))
MEMORY_A14B = MemorySpec(
    **{
        **vars(MEMORY_14B),
        "values": (*MEMORY_14B.values, ("transformer_2", MEMORY_14B.values_of(("transformer",)))),
        "linears": _BOTH_14B_LINEARS,
    }
)
# Wan2.2-I2V-A14B: two 14B transformers taking the image's latents and mask beside the noise (36 input channels:
# its patch embedding's 20 more, no image embedder or image keys and values, no CLIP), both resident as
# T2V-A14B's, and stored as its (both quantized: `linears` both transformers', no fused swap's scratch left);
# planned at 720P as the 14B's.
_I2V_A14B_VALUES = 14_289_163_328
_I2V_A14B = _memory(_I2V_A14B_VALUES, VAE_21_VALUES, PLAN_14B_720P, _LINEARS_14B, 157_286_400)
MEMORY_I2V_A14B = MemorySpec(
    **{
        **vars(_I2V_A14B),
        "values": (*_I2V_A14B.values, ("transformer_2", _I2V_A14B_VALUES)),
        "linears": _BOTH_14B_LINEARS,
    }
)
