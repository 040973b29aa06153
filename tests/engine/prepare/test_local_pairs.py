"""A local pair folder's files are resolved and held inside LOCAL_LORA_DIR, as a single file is (issue 47, item 13):
a half that links out of the folder (absolutely, or through '..') is refused by name, before anything is read; a
half that links elsewhere inside it is read as the file it resolves to."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from engine.prepare.resolve import AdapterResolver
from engine.requests import LoraSpec

HIGH, LOW = "style_high_noise.safetensors", "style_low_noise.safetensors"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """LOCAL_LORA_DIR with a pair whose low half links out of it, and one whose low half links within it."""
    folder = tmp_path / "loras"
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes(b"outside" * 10)
    for name, link in {"out": outside, "dotdot": Path("..", "..", outside.name), "in": folder / "kept" / LOW}.items():
        (folder / name).mkdir(parents=True)
        (folder / name / HIGH).write_bytes(b"high" * 10)
        (folder / name / LOW).symlink_to(link)
    (folder / "kept").mkdir()
    (folder / "kept" / LOW).write_bytes(b"low" * 10)
    (folder / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    return folder


def resolver(root: Path) -> AdapterResolver:
    return AdapterResolver(None, local_dir=root, token=None, max_bytes=2**20)


@pytest.mark.parametrize("name", ["out", "dotdot"])
def test_a_half_linking_out_of_the_folder_is_refused_by_name(root, name):
    assert (root / name / LOW).resolve().is_file()  # it exists, outside LOCAL_LORA_DIR
    said = rf"LoRA 'local:{name}': its file '{LOW}' points outside the local LoRA folder; accepted: files inside it"
    with pytest.raises(InvalidRequestError, match=said):
        resolver(root).locate(LoraSpec(f"local:{name}"))


def test_a_pair_folder_linking_out_is_refused(root):
    with pytest.raises(InvalidRequestError, match=r"'local:linked' points outside the local LoRA folder"):
        resolver(root).locate(LoraSpec("local:linked"))


def test_a_half_linking_inside_the_folder_is_held_as_the_file_it_resolves_to(root):
    made = resolver(root)
    source = made.locate(LoraSpec("local:in"))
    assert (source.local_path, source.pair_path) == (root.resolve() / "in" / HIGH, root.resolve() / "kept" / LOW)
    assert made.fetch(source) == source.local_path and made.fetch_pair(source) == source.pair_path
    assert source.size == len(b"high" * 10) + len(b"low" * 10)
