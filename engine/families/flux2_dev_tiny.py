"""A tiny FLUX.2 [dev] built locally: klein's structure (`engine.families.flux2_tiny`) with [dev]'s guidance
embedding, at a width of its own (88: `TINY_WIDTH`, as the real [dev]'s 6144 is its own), and
Mistral Small 3.1's kind of text encoder, `Mistral3ForConditionalGeneration` (a Mistral language model and a
Pixtral vision tower), read at the layers `Flux2Pipeline` reads (10, 20 and 30).

Its tokenizer is a byte-level BPE in Mistral's layout with a chat template, not Mistral's `PixtralProcessor`:
transformers imports that only with torchvision, which is not installed here, and the pipeline's text prompts
use only its chat template (`apply_chat_template`), which the tokenizer's own does the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel
from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PreTrainedTokenizerFast

from engine.families.flux2_tiny import tiny_flux2_vae
from engine.families.tiny import byte_level_tokenizer

__all__ = ["TINY_TRANSFORMER", "TINY_WIDTH", "build_tiny_pipeline", "tiny_mistral_tokenizer"]

# The tiny [dev]'s hidden width, its own as the real [dev]'s 6144 is (the tiny klein is 56 wide).
TINY_WIDTH = 88

# The tiny transformer: 2 double and 2 single blocks 88 wide (2 heads of 44, RoPE over FLUX.2's 4 axes), FLUX.2's
# 128 packed input channels, and [dev]'s guidance embedding.
TINY_TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": TINY_WIDTH // 2,
    "num_attention_heads": 2,
    # The pipeline stacks Mistral's hidden states of layers 10, 20 and 30: three times the encoder's width.
    "joint_attention_dim": 3 * 32,
    "timestep_guidance_channels": 32,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (10, 10, 12, 12),
    "guidance_embeds": True,
}
# Mistral's special tokens its chat template and (for images) the vision tower's place use.
_SPECIAL = (
    *("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
    *("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
)
# Mistral Small 3.1's turn layout (system prompt, then instructions), over the content lists Flux2Pipeline sends.
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' and message['role'] == 'system' %}[SYSTEM_PROMPT]{{ part['text'] }}[/SYSTEM_PROMPT]"
    "{% elif part['type'] == 'text' %}[INST]{{ part['text'] }}[/INST]{% else %}[IMG]{% endif %}"
    "{% endfor %}{% endfor %}"
)


def tiny_mistral_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with Mistral's special tokens and turn layout, built with `tokenizers` from the
    tiny pipelines' vocabulary (a whole-word token per demo word, bytes for the rest)."""
    tokenizer = byte_level_tokenizer(_SPECIAL)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=_CHAT_TEMPLATE,
        model_max_length=512,
    )


def _text_encoder(tokenizer: PreTrainedTokenizerFast, seed: int) -> Mistral3ForConditionalGeneration:
    """Mistral3ForConditionalGeneration 32 wide with 31 layers, so each layer the pipeline reads is an inner one
    (as in Mistral Small's 40), and a one-layer Pixtral vision tower (never run: prompts are text)."""
    torch.manual_seed(seed)
    image_token: Any = tokenizer.convert_tokens_to_ids("[IMG]")  # one token in, one id out (typed for lists too)
    config = Mistral3Config(
        text_config={
            "model_type": "mistral",
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 31,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 1024,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": 8,
            "patch_size": 8,
            "image_size": 64,
        },
        image_token_index=image_token,
        spatial_merge_size=2,
    )
    return Mistral3ForConditionalGeneration(config)


def build_tiny_pipeline(seed: int = 0) -> Flux2Pipeline:
    """A tiny FLUX.2 [dev]: the transformer above, the tiny Mistral3 encoder and tokenizer, klein's tiny VAE
    (FLUX.2's 32 channels and batch norm) and FLUX.2's flow-match scheduler with dynamic shifting (the pipeline
    passes its own mu); the same seed gives the same weights."""
    tokenizer = tiny_mistral_tokenizer()
    torch.manual_seed(seed + 3)
    transformer = Flux2Transformer2DModel(**TINY_TRANSFORMER)
    vae = tiny_flux2_vae(seed)
    text_encoder = _text_encoder(tokenizer, seed + 4)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)
    pipe = Flux2Pipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    dynamic: Any = pipe  # diffusers' mixins are not visible to the type checker (see engine.pipeline.loading.Pipeline)
    dynamic.set_progress_bar_config(disable=True)
    return pipe
