"""What every tiny random-weight pipeline shares: CLIP and T5 tokenizers, CLIP text configs, a VAE, a scheduler.

Each family builds its tiny pipeline in its own module (`engine.families.<family>.build_tiny`) with its real
structure (blocks, heads, conditioning, text encoders, a cross-attention width of its own, so a LoRA's shapes
tell the tiny ones apart as they tell the real ones apart), small enough that a 64x64, 2-step image takes a
fraction of a second on a CPU. Tests use them, and so does the offline demo when no real model can be had.
`build_tiny` and `ensure_tiny_pipeline` make the one a tiny model id (`engine.settings.TINY_MODEL_IDS`) names.
The weights are deterministic: the same seed gives the same pipeline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, EulerDiscreteScheduler
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import CLIPTextConfig, CLIPTokenizer, PreTrainedTokenizerFast, T5Config, T5Tokenizer

from engine.families.registry import family_spec
from families import TINY_MODEL_IDS

# The default family's tiny pipeline (the first registered family's: `families.Family`).
TINY_MODEL_ID = next(iter(TINY_MODEL_IDS))

__all__ = [
    "TINY_SIDE",
    "TINY_SIZES",
    "TINY_UNET",
    "build_tiny",
    "byte_level_tokenizer",
    "byte_level_vocabulary",
    "ensure_tiny_pipeline",
    "text_config",
    "tiny_qwen_tokenizer",
    "tiny_scheduler",
    "tiny_t5_tokenizer",
    "tiny_tokenizer",
    "tiny_vae",
]

logger = logging.getLogger(__name__)

# A diffusers pipeline (see engine.pipeline.loading.Pipeline).
Pipeline = Any

TINY_SIDE = 64
# The UI's size presets for a tiny pipeline (64-256 px; a real family's are its own buckets).
TINY_SIZES = ((64, 64), (128, 128), (256, 256), (128, 64), (64, 128), (256, 128), (128, 256))
_FORMAT = 1
_MARKER = "switchboard_tiny.json"
# What every tiny UNet shares; its blocks, heads and conditioning are its family's.
TINY_UNET: dict[str, Any] = {
    "sample_size": TINY_SIDE // 2,
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": (32, 64),
    "layers_per_block": 2,
    "norm_num_groups": 8,
}
# Words that get whole-word tokens, so demo prompts tokenize like real ones;
# anything else falls back to byte-level tokens.
_WORDS = (
    "a an the of in on at with and by for to from photo portrait painting drawing sketch render style "
    "cat dog bird fox horse elephant lion tiger bear owl fish dragon robot astronaut knight wizard "
    "woman man girl boy child person face city forest mountain river lake ocean sea sky space moon sun "
    "star night day sunset sunrise snow rain fog castle house street garden flower tree car ship train "
    "red orange yellow green blue purple pink black white gold silver neon pastel dark bright colorful "
    "cinematic lighting detailed highly realistic photorealistic anime cartoon pixel art watercolor oil "
    "ink pencil 3d isometric minimal vintage retro futuristic cyberpunk steampunk fantasy epic cute "
    "wrong blurry ugly low quality best masterpiece lora trigger sks ohwx tok"
).split()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte-to-printable-character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    symbols = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for token in symbols + [s + "</w>" for s in symbols]:
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            joined = parts[0] + parts[1]
            if pair not in merges:
                merges.append(pair)
                vocab.setdefault(joined, len(vocab))
            parts = [joined, *parts[2:]]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return vocab, merges


def byte_level_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A GPT-2-style byte-level BPE vocabulary (Qwen's layout: a word after a space starts with `\u0120`): the 256
    byte symbols, then tokens for the demo words, with and without the space, built by merges (any other text
    falls back to byte tokens)."""
    symbols = list(_bytes_to_unicode().values())
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    merges: list[tuple[str, str]] = []

    def merge(first: str, second: str) -> str:
        if (first, second) not in merges:
            merges.append((first, second))
            vocab.setdefault(first + second, len(vocab))
        return first + second

    for word in _WORDS:
        parts = list(word)
        while len(parts) > 1:
            parts = [merge(parts[0], parts[1]), *parts[2:]]
    for word in _WORDS:
        merge("\u0120", word)
    return vocab, merges


def byte_level_tokenizer(specials: Sequence[str]) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` over `byte_level_vocabulary`, each of `specials` a token of its own
    after the vocabulary's: the body the tiny Qwen, Qwen2.5-VL and Mistral tokenizers share (each family wraps it
    with its own special-token roles, added words and chat template)."""
    vocab, merges = byte_level_vocabulary()
    for special in specials:
        vocab[special] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def tiny_tokenizer(pad_token: str = "<|endoftext|>") -> CLIPTokenizer:
    vocab, merges = _vocab_and_merges()
    # Built from files a tokenizer reports model_max_length 1e30, which makes the pipeline overflow.
    # transformers' annotation says merges are strings; its BPE takes the (first, second) pairs built here.
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)  # type: ignore[arg-type]


def tiny_t5_tokenizer() -> T5Tokenizer:
    """A T5 tokenizer over the same small vocabulary: a Unigram model built by `tokenizers` (transformers'
    T5Tokenizer builds it from the list of pieces), with a whole-word piece per demo word and single characters
    for the rest, so any prompt tokenizes without the 32k-piece SentencePiece model of a real T5."""
    characters = sorted(set("".join(_WORDS)) | set("abcdefghijklmnopqrstuvwxyz0123456789,.!?'-<>"))
    # T5's layout: <pad> 0, </s> 1, <unk> 2, then the pieces (scores: whole words first, then characters).
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(f"\u2581{word}", -1.0) for word in dict.fromkeys(_WORDS)]
    pieces += [(character, -5.0) for character in characters]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def t5_config(tokenizer: T5Tokenizer) -> T5Config:
    """A small T5 encoder's config for `tokenizer` (`tiny_t5_tokenizer`): FLUX.1's and Chroma's tiny T5-XXL."""
    return T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def text_config(tokenizer: CLIPTokenizer, hidden_size: int = 32) -> CLIPTextConfig:
    """A small CLIP text encoder's config for `tokenizer` (its vocabulary and special tokens)."""
    vocab_size, bos, eos = len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=37,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=32,
        hidden_act="gelu",
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def build_tiny(model_id: str, seed: int = 0) -> Pipeline:
    """The tiny pipeline a tiny model id (`engine.settings.TINY_MODEL_IDS`) names, built by its base's family."""
    if model_id not in TINY_MODEL_IDS:
        raise ValueError(f"{model_id!r} is not a tiny model; accepted: {', '.join(TINY_MODEL_IDS)}")
    return family_spec(TINY_MODEL_IDS[model_id]).build_tiny(seed)


def tiny_vae(seed: int, **family: Any) -> AutoencoderKL:
    """A small VAE (2x downsampling); `family` overrides its config where the family's VAE differs (FLUX's:
    16 latent channels, no quant convolutions, its scaling and shift factors)."""
    torch.manual_seed(seed + 1)
    config: dict[str, Any] = {
        "block_out_channels": (16, 32),
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("DownEncoderBlock2D",) * 2,
        "up_block_types": ("UpDecoderBlock2D",) * 2,
        "latent_channels": 4,
        "norm_num_groups": 8,
        "sample_size": TINY_SIDE,
    }
    return AutoencoderKL(**(config | family))


def tiny_scheduler(prediction_type: str = "epsilon") -> EulerDiscreteScheduler:
    return EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
        steps_offset=1,
        prediction_type=prediction_type,
    )


def ensure_tiny_pipeline(folder: Path, seed: int = 0, model_id: str = TINY_MODEL_ID) -> Path:
    """Save the tiny pipeline `model_id` names as an ordinary diffusers folder, once; return the folder."""
    folder = Path(folder)
    marker = folder / _MARKER
    # The SDXL marker predates the model name; keeping it unchanged keeps existing folders valid.
    wanted: dict[str, object] = {"format": _FORMAT, "seed": seed}
    if model_id != TINY_MODEL_ID:
        wanted["model"] = model_id
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return folder
    logger.info("building the tiny pipeline %s (seed %d) in %s", model_id, seed, folder)
    pipe: Any = build_tiny(model_id, seed)
    pipe.save_pretrained(folder, safe_serialization=True)
    marker.write_text(json.dumps(wanted))
    return folder


# Qwen3's chat template as far as Z-Image's and FLUX.2 [klein]'s prompt encoding use it: one user turn, the
# assistant's turn opened (`enable_thinking` true: no empty think block, as in Qwen3's own template).
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer in Qwen's layout, built with `tokenizers` from the tiny pipelines' vocabulary
    (a whole-word token per demo word, bytes for the rest), with Qwen's special tokens and chat template."""
    tokenizer = byte_level_tokenizer(_SPECIAL)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=_CHAT_TEMPLATE,
        model_max_length=512,
    )
