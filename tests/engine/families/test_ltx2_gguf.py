"""An LTX-2 pool whose transformer is a GGUF file (`MODELS` item `Lightricks/LTX-2@FILE.gguf`): the tiny LTX-2
transformer written as Q8_0 (its linears whose widths take 32-value blocks; the rest, and the norms, F32) loads
through diffusers' `from_single_file`, its linears branched; with an LTX-2 LoRA (transformer and connectors) its
frames and sound equal diffusers' own pipeline over the same file with the LoRA loaded unfused, and the stored blocks
are the same bytes after the run, the base's video as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import GGUFQuantizationConfig, LTX2Pipeline, LTX2VideoTransformer3DModel
from torch import nn

from engine.pipeline.loading import load_pipeline
from engine.requests import LoraSpec
from engine.weights.gguf import GGUFBranchedLinear
from engine.weights.quantized import BranchedLinear, held_branches
from families.ltx2 import MODEL_ID
from tests.engine.families.test_ltx2 import request
from tests.engine.weights.test_gguf import blocks_hash
from tests.support.checks import generate
from tests.support.dit import local_engine, pixels
from tests.support.gguf import Q, write_gguf
from tests.support.ltx2 import CASES, Reference, assert_same_video, diffusers_call, write_ltx2_loras

pytest.importorskip("gguf")

LORA = CASES[0].file_name


def diffusers_gguf_video(tiny_dir: Path, gguf: Path, loras: Path) -> Reference:
    """diffusers' own: its pipeline with the transformer from the same GGUF file (float32 compute, as the test
    settings' DTYPE) and the LoRA loaded unfused (transformer and connectors), called as the engine calls it."""
    quantization = GGUFQuantizationConfig(compute_dtype=torch.float32)
    transformer = LTX2VideoTransformer3DModel.from_single_file(
        str(gguf), config=str(tiny_dir), subfolder="transformer", quantization_config=quantization
    )
    pipe: Any = LTX2Pipeline.from_pretrained(tiny_dir, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(loras), weight_name=LORA, adapter_name="a")
    return diffusers_call(pipe)


@pytest.mark.timeout(600)
def test_a_gguf_ltx2_pool_with_a_lora_is_diffusers_unfused_on_the_same_file(
    loaded_ltx2, tiny_ltx2_dir, base_settings, tmp_path
):
    gguf = write_gguf(tmp_path / "ltx2-Q8_0.gguf", loaded_ltx2.denoiser.state_dict(), Q.Q8_0, plain=("norm",))
    loras = tmp_path / "loras"
    write_ltx2_loras(loaded_ltx2.pipe, loras, CASES[:1])
    given = {"model_id": str(tiny_ltx2_dir), "base_model_id": MODEL_ID, "gguf": str(gguf), "gguf_dir": gguf.parent}
    settings = base_settings.replace(**given, lora_max_rank=8, local_lora_dir=loras)
    loaded = load_pipeline(settings, warm=False)
    assert loaded.storage == "gguf"
    linears = [m for m in loaded.denoiser.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, BranchedLinear) for m in linears)
    assert any(isinstance(m, GGUFBranchedLinear) and m.quant_type == Q.Q8_0 for m in linears)
    before = blocks_hash(loaded.denoiser)
    with local_engine(loaded, settings, loras) as engine:
        base = generate(engine, request())
        ours = generate(engine, request(LoraSpec(f"local:{LORA}")))
        again = generate(engine, request())
    theirs = diffusers_gguf_video(tiny_ltx2_dir, gguf, loras)
    assert np.abs(pixels(ours.frames[-1]) - pixels(base.frames[-1])).mean() > 1, "the LoRA must show"
    assert_same_video(ours, theirs, "gguf")
    # The blocks were never written: the base's video after the LoRA run is the one before.
    assert blocks_hash(loaded.denoiser) == before and held_branches(loaded.denoiser) == []
    assert [f.tobytes() for f in again.frames] == [f.tobytes() for f in base.frames]
