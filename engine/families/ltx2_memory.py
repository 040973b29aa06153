"""LTX-2's sizes for the start-up memory plan (`MemorySpec`), and the working memory of a step and of the decodes.

Values, in parameters: the transformer as its card names it (LTX-2: 19 B, video and audio streams together;
LTX-2.3: 22 B), Gemma 3 12B (the text encoder: 12.2 B with its vision tower, never adapted, may run from host RAM),
the connectors, the video and audio VAEs and the vocoder (together under 1.5 B). These are the cards' round
figures, not a count from the configs (no download here): the plan over-reserves rather than under-reserves.

Working memory, from the latent shape: a video of n frames (8k+1) at W x H has (n - 1) / 8 + 1 latent frames of
(H / 32) x (W / 32) tokens (LTX-2's VAE is 32x spatially, 8x in time, its transformer's patches 1x1x1:
`engine.video_checks.latent_tokens`), and its audio 25 latent frames a second (16 kHz mel at hop 160, 4x in time).
A step (guidance runs its branches one after the other, batch 1) peaks in a block's video feed-forward: its
4 x width input and GELU output in bf16 beside the hidden states' float32 copies (4 x 4 x width a token); the
audio stream's tokens are few beside the video's. The video VAE decodes the whole clip: its peak is about 6 bf16
tensors of the full-resolution stage (128 channels, every frame) beside the decoded video in float32. Declared,
not measured here (no GPU).

Each base's pools take what its plan is sized for (`MemorySpec.video_size`: its card's 121 frames at 768 x 512),
which `engine.video_checks` holds every request to, with sides up to twice the short side.
"""

from __future__ import annotations

from engine.families.spec import MemorySpec
from engine.video_checks import latent_tokens

__all__ = ["FRAME_MULTIPLE", "MEMORY", "MEMORY_2_3", "SIDE_MULTIPLE", "decode_bytes", "step_bytes", "tokens"]

_BF16, _F32 = 2, 4
FRAME_MULTIPLE, SIDE_MULTIPLE = 8, 32
_WIDTH = 4096
GEMMA_12B = 12_187_325_040
_VAES_AND_CONNECTORS = 1_500_000_000
_DECODER_TOP, _DECODE_TENSORS = 128, 6
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
    return frames * height * width * (_DECODE_TENSORS * _DECODER_TOP * _BF16 + 3 * _F32)


def _most_frames(side: int) -> int:
    """The most frames the planned tokens leave a square of `side` (8k+1; 1 where none more fits)."""
    latent = tokens(*SIZE) // (side // SIDE_MULTIPLE) ** 2
    return FRAME_MULTIPLE * max(latent - 1, 0) + 1


def _memory(transformer: int) -> MemorySpec:
    frames, width, height = SIZE
    return MemorySpec(
        values=(
            ("transformer", transformer),
            ("text_encoder", GEMMA_12B),
            ("connectors", _VAES_AND_CONNECTORS),
        ),
        host_components=("text_encoder",),
        # The step's and the decode's largest at the planned tokens, the decode at the largest side's square.
        working_bytes=max(
            step_bytes(frames, width, height),
            decode_bytes(frames, width, height),
            decode_bytes(_most_frames(LARGEST_SIDE), LARGEST_SIDE, LARGEST_SIDE),
        ),
        # The video feed-forward's projection, width to 4 x width.
        largest_values=4 * _WIDTH * _WIDTH,
        video_size=SIZE,
        largest_side=LARGEST_SIDE,
    )


MEMORY = _memory(19_000_000_000)
MEMORY_2_3 = _memory(22_000_000_000)
