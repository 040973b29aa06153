"""LTX-2's sizes for the start-up memory plan (`MemorySpec`), and the working memory of a step and of the decodes.

Values: parameters and buffers as diffusers builds each model from its defaults, which are LTX-2 19B's structure
(transformer 48 blocks 4096 wide over video, 2048 over audio: 18.9 B; the connectors, the video and audio VAEs and
the vocoder at 24 kHz), and transformers' Gemma 3 12B from its published config (the text encoder, with its vision
tower; never adapted, it may run from host RAM),
checked on the meta device (tests/engine/pools/test_plan_ltx2.py). LTX-2.3's transformer is declared at its card's
22 B over LTX-2's other parts (its config was not read here): the plan over-reserves rather than under-reserves.

Working memory, from the latent shape: a video of n frames (8k+1) at W x H has (n - 1) / 8 + 1 latent frames of
(H / 32) x (W / 32) tokens (LTX-2's VAE is 32x spatially, 8x in time, its transformer's patches 1x1x1:
`engine.video_checks.latent_tokens`), and its audio 25 latent frames a second (16 kHz mel at hop 160, 4x in time).
A step (guidance runs its branches one after the other, batch 1) peaks in a block's video feed-forward: its
4 x width input and GELU output in bf16 beside the hidden states' float32 copies (4 x 4 x width a token); the
audio stream's tokens are few beside the video's. The video VAE decodes the whole clip: its peak is about 6 bf16
tensors of its last stage (256 channels at a quarter of each side, before its 4x4 patches are unpacked: 16 values a
pixel, every frame) beside the decoded video in float32. Declared,
not measured here (no GPU).

Each base's pools take what its plan is sized for (`MemorySpec.video_size`: its card's 121 frames at 768 x 512),
which `engine.video_checks` holds every request to, with sides up to twice the short side.
"""

from __future__ import annotations

from engine.families.spec import MemorySpec
from engine.storage import LinearSizes
from engine.video_checks import latent_tokens

__all__ = [
    "FRAME_MULTIPLE",
    "GEMMA_12B",
    "MEMORY",
    "MEMORY_2_3",
    "SIDE_MULTIPLE",
    "decode_bytes",
    "step_bytes",
    "tokens",
]

_BF16, _F32 = 2, 4
FRAME_MULTIPLE, SIDE_MULTIPLE = 8, 32
_WIDTH = 4096
TRANSFORMER_19B = 18_876_174_592
GEMMA_12B = 12_202_568_001
# The connectors, the video VAE, the audio VAE and the vocoder.
_PARTS = (("connectors", 1_431_475_200), ("vae", 1_222_479_857), ("audio_vae", 53_248_402), ("vocoder", 55_592_802))
# The 19B transformer's Linears as fp8 storage sizes them, its largest (the video feed-forward's), the connectors'
# largest (their input projection of Gemma's 49 layers), which a quantized pool's fused swap scratch is sized by.
_LINEARS_19B = LinearSizes(18_866_503_680, 4_841_728, 9_815_552)
_LARGEST, _LARGEST_CONNECTORS = 100_663_296, 722_534_400
# The decoder's last stage: its channels over its 4x4 patches' pixels.
_VALUES_A_PIXEL, _DECODE_TENSORS = 256 // 16, 6
# The card's size (121 frames, 5 s at 24 fps, at 768 x 512) and its largest side (twice the short side).
SIZE = (121, 768, 512)
LARGEST_SIDE = 2 * 512


def tokens(frames: int, width: int, height: int) -> int:
    """The transformer's video tokens for `frames` frames at `width` x `height`."""
    return latent_tokens(frames, width, height, FRAME_MULTIPLE, SIDE_MULTIPLE)


def step_bytes(frames: int, width: int, height: int) -> int:
    """A denoising step's peak above the weights (module docstring)."""
    return tokens(frames, width, height) * (2 * _BF16 * 4 * _WIDTH + 4 * _F32 * _WIDTH)


def decode_bytes(frames: int, width: int, height: int) -> int:
    """The video decode's peak above the weights (module docstring)."""
    return frames * height * width * (_DECODE_TENSORS * _VALUES_A_PIXEL * _BF16 + 3 * _F32)


def _most_frames(side: int) -> int:
    """The most frames the planned tokens leave a square of `side` (8k+1; 1 where none more fits)."""
    latent = tokens(*SIZE) // (side // SIDE_MULTIPLE) ** 2
    return FRAME_MULTIPLE * max(latent - 1, 0) + 1


def _memory(transformer: int, linears: LinearSizes | None) -> MemorySpec:
    frames, width, height = SIZE
    return MemorySpec(
        values=(("transformer", transformer), ("text_encoder", GEMMA_12B), *_PARTS),
        host_components=("text_encoder",),
        # The step's and the decode's largest at the planned tokens, the decode at the largest side's square.
        working_bytes=max(
            step_bytes(frames, width, height),
            decode_bytes(frames, width, height),
            decode_bytes(_most_frames(LARGEST_SIDE), LARGEST_SIDE, LARGEST_SIDE),
        ),
        largest_values=_LARGEST,
        largest_encoder_values=_LARGEST_CONNECTORS,
        linears=linears,
        video_size=SIZE,
        largest_side=LARGEST_SIDE,
    )


MEMORY = _memory(TRANSFORMER_19B, _LINEARS_19B)
# LTX-2.3: its Linears' fp8 sizes are known once loaded.
MEMORY_2_3 = _memory(22_000_000_000, None)
