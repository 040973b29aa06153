"""An LTX-2.3 LoRA and an LTX-2 one told apart by their tensors, where neither card nor metadata says which: by the
layers only one version has (diffusers 0.42.1's transformer_ltx2.py and ltx2/connectors.py: 2.0's
`caption_projection` and connectors' `text_proj_in`, 2.3's `prompt_adaln` and per-modality `video_text_proj_in`).
Routing sends it to its version's pool; on the other version's pool it runs with a note naming the version it was
made for. A LoRA of the layers both have (attentions, feed-forwards: same names, same widths) still cannot tell."""

from __future__ import annotations

import pytest

from engine.families.origin import check_origin, judge_origin
from engine.pools.routing import PoolInfo, pick_pool
from families.ltx2 import MODEL_ID, MODEL_ID_2_3
from lora_catalog.entries import Family

WIDTH, TEXT, RANK = 4096, 3840, 4
# The video self-attention both versions have, in diffusers' names.
SHARED = {
    f"transformer.transformer_blocks.0.attn1.to_{p}.lora_{f}.weight": (RANK, WIDTH) if f == "A" else (WIDTH, RANK)
    for p in "qkv"
    for f in "AB"
}


def _pair(stem: str, width: int, out: int) -> dict[str, tuple[int, ...]]:
    return {f"{stem}.lora_A.weight": (RANK, width), f"{stem}.lora_B.weight": (out, RANK)}


# A layer only one version has, in diffusers' names and in the original trainer's.
ONLY = {
    MODEL_ID_2_3: {
        "prompt_adaln": _pair("transformer.prompt_adaln.linear", WIDTH, 2 * WIDTH),
        "original_prompt_adaln": _pair("diffusion_model.prompt_adaln_single.linear", WIDTH, 2 * WIDTH),
    },
    MODEL_ID: {
        "caption_projection": _pair("transformer.caption_projection.linear_1", TEXT, WIDTH),
        "original_caption_projection": _pair("diffusion_model.audio_caption_projection.linear_1", TEXT, 2048),
        "text_proj_in": _pair("connectors.text_proj_in", TEXT * 49, TEXT),
        "aggregate_embed": _pair("text_embedding_projection.aggregate_embed", TEXT * 49, TEXT),
    },
}
CASES = [(version, name, layer) for version, layers in ONLY.items() for name, layer in layers.items()]
POOLS = [PoolInfo(base, Family.LTX2, frozenset({WIDTH}), frozenset({TEXT})) for base in (MODEL_ID, MODEL_ID_2_3)]


def _origin(shapes: dict[str, tuple[int, ...]]):
    return judge_origin((), lambda: ({}, shapes))


@pytest.mark.parametrize(("version", "layer"), [(v, layer) for v, _, layer in CASES], ids=[n for _, n, _ in CASES])
def test_a_version_only_layer_routes_to_its_version_and_notes_the_other(version, layer):
    origin = _origin({**SHARED, **layer})
    assert origin.families == (Family.LTX2,) and origin.how == "shapes"
    assert origin.bases == (version,)
    # Both versions served: its own version's pool, whichever MODELS lists first.
    for pools in (POOLS, POOLS[::-1]):
        index = pick_pool("lora", origin, pools)
        assert index is not None and pools[index].base_model_id == version
    # Only the other version served: it runs there, with a note naming the version it was made for.
    other = MODEL_ID if version == MODEL_ID_2_3 else MODEL_ID_2_3
    note = check_origin("lora", origin, other)
    made_for = "LTX-2.3" if version == MODEL_ID_2_3 else "LTX-2 19B"
    assert note is not None and f"was made for {made_for}" in note and version in note, note


def test_a_lora_of_the_layers_both_versions_have_cannot_tell_and_says_so():
    origin = _origin(dict(SHARED))
    assert origin.families == (Family.LTX2,) and origin.bases == ()
    note = check_origin("lora", origin, MODEL_ID_2_3)
    assert note is not None and "cannot tell" in note, note


def test_a_per_modality_connector_lora_names_no_version_as_2_3_and_2_5_both_have_it():
    """LTX-2.5 keeps 2.3's per-modality connector projections (diffusers 0.42.1 modular_pipelines/ltx2/encoders.py
    keeps the single one for "the LTX-2.0 connector branch"): such a LoRA is not 2.0's, and no one version's."""
    origin = _origin({**SHARED, **_pair("connectors.video_text_proj_in", TEXT * 49, WIDTH)})
    assert origin.families == (Family.LTX2,) and origin.bases == ()
    with_adaln = {
        **SHARED,
        **_pair("connectors.video_text_proj_in", TEXT * 49, WIDTH),
        **ONLY[MODEL_ID_2_3]["prompt_adaln"],
    }
    assert _origin(with_adaln).bases == (MODEL_ID_2_3,)


def test_layers_of_both_versions_name_neither():
    layers = {**ONLY[MODEL_ID]["caption_projection"], **ONLY[MODEL_ID_2_3]["prompt_adaln"]}
    assert _origin({**SHARED, **layers}).bases == ()
