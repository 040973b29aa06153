"""What every DiT family's swap promises, one test each over the families (tests/support/swaps.py): every LoRA
naming its diffusers loader reads gives diffusers' own image with the LoRA fused (within 2 levels), and after
swaps across every naming and the family's refusals the base is bit-exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.requests import LoraSpec
from families import Family
from tests.support.checks import generate
from tests.support.dit import assert_components_pristine, local_engine, pixels
from tests.support.images import assert_images_close
from tests.support.swaps import FAMILIES, SwapFamily
from tests.support.tiny import TINY_FAMILIES

BY_FAMILY = {row.family: row for row in FAMILIES}
# The tiny families the shared swap tests leave to their own files: the UNets (tests/engine/test_engine_*.py,
# families/test_sd15.py), FLUX.1 Kontext (FLUX.1's namings, checked as edits in families/test_flux_kontext.py) and
# the Wan families (videos: each naming checked on every frame, and the restore, in families/test_wan*.py).
NOT_HERE = {Family.SDXL, Family.SD15, Family.FLUX_KONTEXT, Family.WAN, Family.WAN_I2V, Family.WAN22, Family.WAN22_I2V}
# LTX-2's swaps, on its transformer and its connectors, frames and sound: test_ltx2.py.
NOT_HERE |= {Family.LTX2}


def test_every_tiny_dit_family_has_its_row():
    assert set(BY_FAMILY) == set(TINY_FAMILIES) - NOT_HERE


@pytest.fixture(scope="module")
def lora_folders(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[Family, Path]:
    """Each family's files (written on first use), one folder a family."""

    class Folders(dict):
        def __missing__(self, family: Family) -> Path:
            folder = tmp_path_factory.mktemp(f"swaps-{family.value}")
            BY_FAMILY[family].write(tiny_models, folder)
            self[family] = folder
            return folder

    return Folders()


@pytest.fixture
def swap(request: pytest.FixtureRequest, tiny_models, lora_folders, base_settings) -> Iterator[tuple[Any, ...]]:
    """(row, engine, folder, loaded pipeline) for the test's family; the engine closed (its base restored) after."""
    row: SwapFamily = request.param
    folder = lora_folders[row.family]
    loaded = tiny_models.loaded(row.family)
    tiny_models.pristine(row.family)  # its copy taken before any swap
    settings = base_settings.replace(local_lora_dir=folder, base_model_id=loaded.base_model_id)
    with local_engine(loaded, settings, folder) as engine:
        yield row, engine, folder, loaded


@pytest.fixture(scope="module")
def base_images() -> dict[Family, np.ndarray]:
    return {}


NAMINGS = [(row, case) for row in FAMILIES for case in row.cases]


@pytest.mark.parametrize(
    ("swap", "case"), NAMINGS, ids=[f"{r.family.value}-{c.name}" for r, c in NAMINGS], indirect=["swap"]
)
def test_each_lora_naming_matches_diffusers_fuse(swap, case, tiny_models, base_images):
    row, engine, folder, _ = swap
    if row.family not in base_images:  # the same request on the same weights: one image a family
        base_images[row.family] = pixels(generate(engine, row.request()).image)
    base = base_images[row.family]
    result = generate(engine, row.request(LoraSpec(f"local:{case.file_name}", scale=0.8)))
    ours = pixels(result.image)
    assert result.image.size == (64, 64) and result.request.mode == row.mode
    reference = pixels(row.reference(tiny_models.folder(row.family), folder, case.reference_name, 0.8))
    assert np.abs(reference - base).mean() > 2, "the LoRA must visibly change the image"
    assert_images_close(ours, reference)
    if row.mean_below is not None:
        assert np.abs(ours - reference).mean() < row.mean_below
    assert engine.check_lora(LoraSpec(f"local:{case.file_name}")).components == row.components(case)


@pytest.mark.parametrize("swap", FAMILIES, ids=[r.family.value for r in FAMILIES], indirect=True)
def test_the_base_is_bit_exact_after_swaps_across_namings_and_failures(swap, tiny_models):
    row, engine, _, loaded = swap
    base = generate(engine, row.request()).image.tobytes()
    for index, case in enumerate(row.restore_cases):
        generate(engine, row.request(LoraSpec(f"local:{case.file_name}"), steps=row.restore_steps))
        for refusal in row.refusals:
            if index % refusal.every == refusal.at:
                with pytest.raises(refusal.error):
                    generate(engine, row.request(LoraSpec(f"local:{refusal.ref or case.file_name}"), **refusal.fields))
    engine.restore_base_weights()
    pristine = tiny_models.pristine(row.family)
    assert_components_pristine(loaded.pipe, pristine, sorted({key.split(".")[0] for key in pristine}))
    assert generate(engine, row.request()).image.tobytes() == base


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
