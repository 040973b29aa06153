"""LTX-2's identity (Lightricks' audio-video DiT, LTX-2 19B, LTX-2.3 and LTX-2.5: one transformer over video and audio
tokens, and the text connectors between Gemma 3 and it): its blocks' video and audio attentions and feed-forwards
at the top of a LoRA's names, in every naming diffusers' `LTX2LoraLoaderMixin` reads (diffusers' `transformer.
transformer_blocks.N.attn1`, the original trainer's `diffusion_model.transformer_blocks.N.attn1`), and the text
connectors' (`connectors.` / the original `text_embedding_projection.`). Its own layers, which no other served
architecture has: the audio stream's (`audio_attn1`, `audio_ff`), the cross-modal attentions (`audio_to_video_attn`,
`video_to_audio_attn`), the video's numbered `attn1`/`attn2` directly under a top-level `transformer_blocks` (a
UNet's sit under `down_blocks`, Qwen-Image's and FLUX's are `attn`) and the connectors."""

from __future__ import annotations

import re

from families.identity import Base, CivitaiLabel, Claims, Family, FamilyIdentity, Spellings

__all__ = ["IDENTITY", "MODEL_ID", "MODEL_ID_2_3", "MODEL_ID_2_5", "TINY_ID", "claims", "own_claims"]

MODEL_ID = "Lightricks/LTX-2"
MODEL_ID_2_3 = "diffusers/LTX-2.3-Diffusers"
MODEL_ID_2_5 = "Lightricks/LTX-2.5-Diffusers"
TINY_ID = "tiny-ltx2"
LTX2 = Base(MODEL_ID, "LTX-2 19B")
# LTX-2.3: the same loader and pipeline, other weights (and blocks: its prompt modulation, `prompt_adaln`). Users
# report LoRAs of one version failing on the other: declared as a checkpoint of LTX-2, a LoRA whose card or metadata
# (`names`) says it was made for the other version runs with a warning saying so (`engine.families.origin`), and one
# whose factors fit no layer there is refused by its widths.
LTX2_3 = LTX2.checkpoint(MODEL_ID_2_3, "LTX-2.3 22B", names=r"ltx[-_ ]?(video[-_ ]?)?2[._]3")
# LTX-2.5: the same pipeline class again (`LTX2Pipeline` reads its Gemma 4 text encoder, prompt enhancer and duration
# head), its transformer 2.3's without the prompt modulation MLP (`use_prompt_adaln_single=False`), the feed-forward
# biases (`ff_bias=False`), and with a keyframe position embedding (diffusers 0.42.1 transformer_ltx2.py). Users
# report LTX-2.3 LoRAs failing on it: a LoRA whose card or metadata names the other version runs with a warning.
LTX2_5 = LTX2.checkpoint(MODEL_ID_2_5, "LTX-2.5 22B", names=r"ltx[-_ ]?(video[-_ ]?)?2[._]5")
_BLOCK = r"^(transformer\.|diffusion_model\.)?transformer_blocks[._]\d+[._]"
# Every LTX-2 LoRA name: a block's layer, a connector's.
_CLAIMS = re.compile(
    _BLOCK + r"(attn1|attn2|ff|audio_\w+|audio_to_video_attn|video_to_audio_attn)[._]"
    r"|^(connectors|text_embedding_projection)\."
)
# The layers only LTX-2 has (see the module docstring); a block's `ff` is shared with FLUX.1's diffusers names.
_OWN = re.compile(
    _BLOCK + r"(attn1|attn2|audio_attn1|audio_attn2|audio_ff|audio_to_video_attn|video_to_audio_attn)[._]"
    r"|^(connectors|text_embedding_projection)\."
)


def claims(name: str) -> bool:
    """A lower-cased tensor name of an LTX-2 LoRA."""
    return bool(_CLAIMS.search(name))


def own_claims(name: str) -> bool:
    """A lower-cased tensor name only LTX-2 LoRAs have."""
    return bool(_OWN.search(name))


IDENTITY = FamilyIdentity(
    family=Family.LTX2,
    label="LTX-2",
    bases=(LTX2, LTX2_3, LTX2_5),
    # The LTX trainer's and ai-toolkit's ModelSpec architectures ("ltx-2", "ltxv2"), ComfyUI's "ltxv".
    spellings=Spellings(
        architectures=("ltx-2", "ltx_2", "ltxv2", "ltx2", "ltx-video-2"),
        kohya_versions=("ltx-2", "ltx_2", "ltxv2", "ltx2"),
        checkpoint_names=r"ltx[-_]?(video[-_]?)?2",
    ),
    claims=Claims(names=claims, own=own_claims, labels=own_claims),
    released="2025-10",
    # Civitai's LTXV2 base groups.
    civitai=(CivitaiLabel("LTXV2", MODEL_ID),),
    tiny_id=TINY_ID,
)
