"""A LoHa or DoRA file whose ΔW is kept from preparation (on the CPU) is charged for it in the load gate (issue 20,
defect 10): before the fix the gate counted the file's bytes only, while the kept float32 ΔW may take up to a
quarter of `HOST_CACHE_BYTES` per adapter being prepared."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download

from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate


def one(ref: str) -> GenerateRequest:
    return GenerateRequest(prompt="a fox", steps=1, seed=3, loras=(LoraSpec(ref),))


def file_size(repo: str, name: str, tmp_path: Path) -> int:
    return Path(hf_hub_download(repo, name, cache_dir=tmp_path)).stat().st_size


@pytest.mark.parametrize(("role", "name"), [("loha", "loha_style.safetensors"), ("dora", "dora_style.safetensors")])
def test_a_kept_delta_is_charged_to_the_load_gate(make_engine, fixtures, tmp_path, role, name):
    engine = make_engine()
    generate(engine, one(fixtures[role]))
    kept = engine.status().cached[0].host_bytes
    size = file_size(fixtures[role], name, tmp_path)
    assert kept > 2 * size  # the kept ΔW dwarfs the factors (so the charge below is not the file's alone)
    _, peak_bytes = engine._preparer._gates["request"].peaks  # type: ignore[union-attr]
    assert peak_bytes >= size + kept


def test_a_plain_lora_is_charged_its_file_only(make_engine, fixtures, tmp_path):
    engine = make_engine()
    generate(engine, one(fixtures["peft"]))
    _, peak_bytes = engine._preparer._gates["request"].peaks  # type: ignore[union-attr]
    assert peak_bytes == file_size(fixtures["peft"], "pytorch_lora_weights.safetensors", tmp_path)
