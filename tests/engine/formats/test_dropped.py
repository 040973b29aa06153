"""A LoRA file of which the family's converter (diffusers') drops SOME tensors is refused naming them, on every
family and in every naming its tests write: each of the family's valid files, plus one pair of factors under a
layer-like name no served architecture has (in the file's own naming), is a 400 that names the added key (the
file's, not a converter's spelling of it). diffusers' loaders run such a file with that part quietly missing
(Wan's, LTX-2's, FLUX's, Z-Image's converters drop names they do not know); Qwen-Image's spells it as another
module (`transformer_blocks.j`). The valid files alone load (their equality to diffusers: each family's tests)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from engine.errors import IncompatibleLoraError
from engine.families.registry import served_specs
from engine.formats.targets import TargetTable
from families import Family
from serving.demo.synthetic import save_lora
from tests.support import chroma, flux, flux2, krea2, ltx2, qwen_image, sd15, wan, zimage
from tests.support.formats import load, spec_table
from tests.support.loras import kohya_file, peft_file

SPECS = served_specs()
# A pair's down factor in each naming the families' tests write, and its up factor's suffix.
_DOWN = re.compile(r"^(?P<stem>.+?)(?P<sep>[._])(?P<down>lora_down|lora_A|lora\.down)(?P<rest>(\.default)?\.weight)$")
_COMPONENTS = ("transformer.", "unet.", "text_encoder.", "text_encoder_2.", "connectors.")
_TEXT = ("lora_te", "text_encoder", "connectors")  # a text encoder's (or LTX-2's connectors') pairs
_UP = {"lora_down": "lora_up", "lora_A": "lora_B", "lora.down": "lora.up"}


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
    """FLUX.1's converter (diffusers') filters out a kohya T5 pair from a ComfyUI-named file and loads the rest: the
    refusal gives the count of the file's tensors it would drop, names them, and says what is accepted."""
    table, path, tensors = _flux_comfy(tmp_path)
    added = _t5_pair(tensors)
    save_file({**tensors, **added}, str(path))
    with pytest.raises(IncompatibleLoraError) as caught:
        load(path, table)
    message = str(caught.value)
    assert f"{len(added)} of its {len(tensors) + len(added)} tensors" in message, message
    assert all(name in message for name in added), message
    assert "accepted: plain LoRA" in message, message


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
