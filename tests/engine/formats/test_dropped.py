"""A LoRA file of which the family's converter (diffusers') drops SOME tensors is refused naming them, on every
family and in every naming its tests write: each of the family's valid files, plus one pair of factors under a
layer-like name no served architecture has (in the file's own naming), is a 400 that names the added key (the
file's, not a converter's spelling of it). diffusers' loaders run such a file with that part quietly missing
(Wan's, LTX-2's, FLUX's, Z-Image's converters drop names they do not know); Qwen-Image's spells it as another
module (`transformer_blocks.j`). The valid files alone load (their equality to diffusers: each family's tests).
The one part that runs dropped is a FLUX.1 file's T5 part in kohya's or ComfyUI's names, which diffusers' FLUX
converter drops by design: the file runs as diffusers runs it, with a warning naming the part."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from diffusers import FluxPipeline
from safetensors.torch import load_file, save_file

from engine.errors import IncompatibleLoraError
from engine.families.registry import served_specs
from engine.formats.targets import TargetTable
from engine.requests import GenerateRequest, LoraSpec
from families import Family
from serving.demo.synthetic import save_lora
from tests.support import chroma, flux, flux2, krea2, ltx2, qwen_image, sd15, wan, zimage
from tests.support.checks import generate
from tests.support.dit import PROMPT, diffusers_image, local_engine
from tests.support.formats import load, spec_table
from tests.support.images import assert_images_close
from tests.support.loras import kohya_file, peft_file

SPECS = served_specs()
# A pair's down factor in each naming the families' tests write, and its up factor's suffix.
_DOWN = re.compile(r"^(?P<stem>.+?)(?P<sep>[._])(?P<down>lora_down|lora_A|lora\.down)(?P<rest>(\.default)?\.weight)$")
_COMPONENTS = ("transformer.", "unet.", "text_encoder.", "text_encoder_2.", "connectors.")
_TEXT = ("lora_te", "text_encoder", "connectors")  # a text encoder's (or LTX-2's connectors') pairs
_UP = {"lora_down": "lora_up", "lora_A": "lora_B", "lora.down": "lora.up"}
# FLUX.1's families, whose converter drops a T5 part in kohya's (`lora_te2_`) or ComfyUI's names by design: such a
# file runs without it, as in diffusers, with a warning. Refused still: PEFT's names (`text_encoder_2.`) and an
# XLabs file's (its converter keeps the pair, which then lands on no module).
_T5_RUNS = {Family.FLUX, Family.FLUX_KONTEXT}
_T5_NAMES = ("lora_te2_", "text_encoders.t5xxl.")


def _t5_runs(family: Family, file_name: str, added: dict[str, Any]) -> bool:
    return family in _T5_RUNS and "xlabs" not in file_name and all(name.startswith(_T5_NAMES) for name in added)


def _sdxl(pipe: Any, folder: Path) -> None:
    (folder / "sdxl_kohya.safetensors").write_bytes(kohya_file(pipe, seed=1))
    (folder / "sdxl_peft.safetensors").write_bytes(peft_file(pipe, seed=2))


def _wan(pipe: Any, folder: Path) -> None:
    # Wan's namings (its full differences are placed by their own tests: tests/engine/formats/test_full_differences.py).
    wan.write_wan_loras(pipe, folder, wan.CASES)


def _flux(pipe: Any, folder: Path) -> None:
    flux.write_flux_loras(pipe, folder, cases=(*flux.CASES, *flux.BFL_CASES))


WRITERS: dict[Family, Callable[[Any, Path], Any]] = {
    Family.SDXL: _sdxl,
    Family.SD15: sd15.write_sd15_loras,
    Family.SD2: sd15.write_sd15_loras,
    Family.FLUX: _flux,
    Family.FLUX_KONTEXT: _flux,
    Family.FLUX2: flux2.write_flux2_loras,
    Family.FLUX2_DEV: flux2.write_flux2_loras,
    Family.CHROMA: chroma.write_chroma_loras,
    Family.KREA2: krea2.write_krea2_loras,
    Family.ZIMAGE: zimage.write_zimage_loras,
    Family.QWEN_IMAGE: qwen_image.write_qwen_loras,
    Family.QWEN_IMAGE_EDIT: qwen_image.write_qwen_loras,
    Family.QWEN_IMAGE_EDIT_PLUS: qwen_image.write_qwen_loras,
    Family.WAN: _wan,
    Family.WAN_I2V: _wan,
    Family.WAN22: _wan,
    Family.WAN22_I2V: _wan,
    Family.LTX2: ltx2.write_ltx2_loras,
}


def test_every_served_family_has_its_writer():
    assert {spec.family for spec in SPECS} == set(WRITERS)


def _unknown_pair(tensors: dict[str, Any]) -> dict[str, Any]:
    """A copy of the file's first pair of factors (the denoiser's) under a layer-like name none has (`…extra_proj`),
    named as the file names its layers (kohya's underscores, or dots), with its alpha where the file has one."""
    downs = [name for name in sorted(tensors) if _DOWN.match(name)]
    down = next((name for name in downs if not name.startswith(_TEXT)), downs[0])  # the denoiser's, where it has
    match = _DOWN.match(down)
    assert match is not None
    stem, sep = match["stem"], match["sep"]
    kohya = "." not in stem
    head = stem.rsplit("_" if kohya else ".", 1)[0]
    new = f"{head}_extra_proj" if kohya else f"{head}.extra_proj"
    up = f"{stem}{sep}{_UP[match['down']]}{match['rest']}"
    added = {
        f"{new}{sep}{match['down']}{match['rest']}": tensors[down].clone(),
        f"{new}{sep}{_UP[match['down']]}{match['rest']}": tensors[up].clone(),
    }
    if f"{stem}.alpha" in tensors:
        added[f"{new}.alpha"] = tensors[f"{stem}.alpha"].clone()
    return added


def _t5_pair(tensors: dict[str, Any]) -> dict[str, Any]:
    """A pair on a layer of FLUX.1's T5, which no served pipeline adapts, named as the file names its layers:
    sd-scripts' `lora_te2_` (kohya's names), ComfyUI's `text_encoders.t5xxl.transformer.` (the original names), or
    diffusers' `text_encoder_2.` (PEFT's). diffusers' FLUX.1 converter filters the first two out, LTX-2's ignores
    them."""
    down = next(name for name in sorted(tensors) if _DOWN.match(name))
    match = _DOWN.match(down)
    assert match is not None
    stem, sep = match["stem"], match["sep"]
    if "." not in stem:
        new = "lora_te2_encoder_block_0_layer_0_SelfAttention_q"
    elif stem.startswith(_COMPONENTS):
        new = "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q"
    else:
        new = "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q"
    up = f"{stem}{sep}{_UP[match['down']]}{match['rest']}"
    return {
        f"{new}{sep}{match['down']}{match['rest']}": tensors[down].clone(),
        f"{new}{sep}{_UP[match['down']]}{match['rest']}": tensors[up].clone(),
    }


@pytest.mark.parametrize("spec", SPECS, ids=[s.family.value for s in SPECS])
def test_a_file_with_one_pair_the_converter_drops_is_refused_naming_it(spec, tmp_path):
    pipe = spec.build_tiny(0)
    table = spec_table(spec, pipe)
    valid = tmp_path / "valid"
    valid.mkdir()
    WRITERS[spec.family](pipe, valid)
    files = sorted(valid.glob("*.safetensors"))
    assert files
    for path in files:
        assert load(path, table).layers, path.name  # the file alone loads
        tensors = load_file(str(path))
        for kind, added in (("extra", _unknown_pair(tensors)), ("t5", _t5_pair(tensors))):
            broken = tmp_path / f"{kind}_{path.name}"
            save_lora(broken, {**tensors, **added})
            if kind == "t5" and _t5_runs(spec.family, path.name, added):
                warnings = load(broken, table).warnings
                assert any(all(name in w for name in added) for w in warnings), (path.name, warnings)
                continue
            with pytest.raises(IncompatibleLoraError) as caught:
                load(broken, table)
            message = str(caught.value)
            assert caught.value.status == 400, (kind, path.name, message)
            assert any(name in message for name in added), (kind, path.name, message)


def _flux_comfy(folder: Path) -> tuple[TargetTable, Path, dict[str, Any]]:
    """A tiny FLUX.1's target table, and a ComfyUI-named LoRA file for it (its path and tensors)."""
    spec = next(s for s in SPECS if s.family is Family.FLUX)
    pipe = spec.build_tiny(0)
    flux.write_flux_loras(pipe, folder, cases=[c for c in flux.CASES if c.name == "comfy"])
    path = folder / "flux_comfy.safetensors"
    return spec_table(spec, pipe), path, load_file(str(path))


def test_the_refusal_counts_what_is_dropped_and_says_what_is_accepted(tmp_path):
    """FLUX.1's converter (diffusers') filters a CLIP `text_projection` pair out of a ComfyUI-named file and loads
    the rest: the refusal gives the count of the file's tensors it would drop, names them, and says what is
    accepted; beside a T5 part (which runs dropped) the count and names are the other pair's alone."""
    table, path, tensors = _flux_comfy(tmp_path)
    t5 = _t5_pair(tensors)
    projection = "text_encoders.clip_l.transformer.text_projection"
    added = {f"{projection}.{name.rpartition('.q.')[2]}": value.clone() for name, value in t5.items()}
    save_file({**tensors, **added, **t5}, str(path))
    with pytest.raises(IncompatibleLoraError) as caught:
        load(path, table)
    message = str(caught.value)
    assert f"{len(added)} of its {len(tensors) + len(added) + len(t5)} tensors" in message, message
    assert all(name in message for name in added), message
    assert not any(name in message for name in t5), message
    assert "accepted: plain LoRA" in message, message


def test_a_flux1_kohya_file_with_a_t5_part_runs_without_it_as_diffusers_does(
    tmp_path, tiny_models, base_settings, tiny_flux_dir
):
    """A kohya FLUX.1 file with a non-zero T5 part (`lora_te2_`), which diffusers' converter drops (its loader runs
    the rest): the engine's image equals diffusers' load_lora_weights + fuse_lora of the same file within 2 levels,
    and the result's warnings (X-Warnings, the UI's notes) name the part, its count, and that it is not applied."""
    loaded = tiny_models.loaded(Family.FLUX)
    flux.write_flux_loras(loaded.pipe, tmp_path, cases=[c for c in flux.CASES if c.name == "kohya"])
    tensors = load_file(str(tmp_path / "flux_kohya.safetensors"))
    t5 = _t5_pair(tensors)
    assert all(name.startswith("lora_te2_") and value.count_nonzero() for name, value in t5.items())
    save_lora(tmp_path / "flux_t5.safetensors", {**tensors, **t5})
    settings = base_settings.replace(local_lora_dir=tmp_path, base_model_id=loaded.base_model_id)
    run = GenerateRequest(
        prompt=PROMPT,
        loras=(LoraSpec("local:flux_t5.safetensors"),),
        steps=3,
        guidance=3.5,
        width=64,
        height=64,
        seed=7,
    )
    with local_engine(loaded, settings, tmp_path) as engine:
        result = generate(engine, run)
    components = ("transformer", "text_encoder")
    theirs = diffusers_image(
        FluxPipeline, tiny_flux_dir, tmp_path, "flux_t5.safetensors", components=components, guidance=3.5
    )
    assert_images_close(result.image, theirs)
    said = [w for w in result.warnings if "T5 part" in w]
    assert len(said) == 1 and f"({len(t5)} tensors: " in said[0], result.warnings
    assert all(name in said[0] for name in t5) and "not applied" in said[0], said


def test_a_dropped_part_of_zeros_is_no_loss(tmp_path):
    """A part the converter drops that is all zeros (diffusers' FLUX.1 converter purges such T5 pairs as
    "ineffective"; trainers save them so) changes nothing: the file loads, as the file without it does."""
    table, path, tensors = _flux_comfy(tmp_path)
    alone = load(path, table)
    zeros = {name: value.zero_() for name, value in _t5_pair(tensors).items()}
    with_zeros = tmp_path / "with_zeros.safetensors"
    save_file({**tensors, **zeros}, str(with_zeros))
    loaded = load(with_zeros, table)
    assert len(loaded.layers) == len(alone.layers)
    for mine, theirs in zip(loaded.layers, alone.layers, strict=True):
        assert mine.target == theirs.target and mine.scaling == theirs.scaling
        assert all(a.equal(b) for a, b in zip(mine.tensors, theirs.tensors, strict=True))
