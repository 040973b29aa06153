"""A LoRA file of which no tensor lands on the served pipeline's modules is refused, by name, on every family: one
check (`engine.formats.adapters`) after whichever family's converter read it, in every naming a file may use.
diffusers' own loaders warn and load nothing for such a file (the user would pay and get the base)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.errors import IncompatibleLoraError
from engine.families.registry import served_specs
from serving.demo.synthetic import save_lora
from tests.support.formats import load, spec_table

SPECS = served_specs()
# A layer no served architecture has, in each naming a file may use (diffusers/PEFT with the denoiser's component
# or a UNet's, ComfyUI's `diffusion_model.`, kohya's `lora_unet_`, and bare names).
STEMS = {
    "peft": "transformer.no_such_block.0.proj",
    "unet": "unet.no_such_block.0.proj",
    "comfy": "diffusion_model.no_such_block.0.proj",
    "bare": "no_such_block.0.proj",
}


def unplaced_files(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    files = {
        name: {f"{stem}.lora_A.weight": torch.ones(4, 32), f"{stem}.lora_B.weight": torch.ones(32, 4)}
        for name, stem in STEMS.items()
    }
    kohya = "lora_unet_no_such_block_0_proj"
    files["kohya"] = {
        f"{kohya}.lora_down.weight": torch.ones(4, 32),
        f"{kohya}.lora_up.weight": torch.ones(32, 4),
        f"{kohya}.alpha": torch.tensor(4.0),
    }
    for name, tensors in files.items():
        save_lora(folder / f"{name}.safetensors", tensors)
    return files


@pytest.mark.parametrize("spec", SPECS, ids=[s.family.value for s in SPECS])
def test_a_file_of_which_no_tensor_lands_is_refused_naming_it_on_every_family(spec, tmp_path):
    pipe = spec.build_tiny(0)
    table = spec_table(spec, pipe)
    for name, tensors in unplaced_files(tmp_path).items():
        with pytest.raises(IncompatibleLoraError) as caught:
            load(tmp_path / f"{name}.safetensors", table)
        message = str(caught.value)
        assert caught.value.status == 400, name
        # Named by the file's own keys, also where a converter spells them as another module (diffusers' Qwen-Image
        # converter makes kohya's `lora_unet_no_such_block_0_proj` `transformer_blocks.j`).
        assert any(key in message for key in tensors), (name, message)
