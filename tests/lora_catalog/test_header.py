"""The strict safetensors header reader: valid files in every form, and each way a file can lie."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save, save_file

from lora_catalog import HeaderError, SafetensorsHeader, read_header, read_header_bytes


def _raw(header: object, data: bytes = b"", *, declared: int | None = None) -> bytes:
    """A safetensors file with a header we control, lies included."""
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(encoded) if declared is None else declared
    return struct.pack("<Q", length) + encoded + data


def _tensor(dtype: str = "F32", shape: list[int] | None = None, start: int = 0, end: int = 16) -> dict[str, object]:
    return {"dtype": dtype, "shape": [2, 2] if shape is None else shape, "data_offsets": [start, end]}


def _write(tmp_path: Path, content: bytes, name: str = "lora.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.fixture
def good_file(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    tensors = {
        "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": np.ones((4, 8), np.float16),
        "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.alpha": np.array(4.0, np.float32),
        "mask": np.zeros((3,), np.bool_),
    }
    save_file(tensors, str(path), metadata={"ss_base_model_version": "sdxl_base_v1-0", "ss_output_name": "pix"})
    return path


def test_reads_a_real_file_from_a_path_a_stream_and_bytes(good_file: Path) -> None:
    from_path = read_header(good_file)
    with good_file.open("rb") as stream:
        from_stream = read_header(stream)
    from_bytes = read_header_bytes(good_file.read_bytes(), file_size=good_file.stat().st_size)
    assert from_path == from_stream == from_bytes
    assert isinstance(from_path, SafetensorsHeader)
    weight = from_path.tensors["lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"]
    assert (weight.dtype, weight.shape, weight.end - weight.start) == ("F16", (4, 8), 64)
    assert from_path.tensors["lora_te1_text_model_encoder_layers_0_self_attn_q_proj.alpha"].shape == ()
    assert from_path.metadata == {"ss_base_model_version": "sdxl_base_v1-0", "ss_output_name": "pix"}
    assert from_path.data_start == 8 + from_path.header_size
    assert good_file.stat().st_size == from_path.data_start + from_path.data_size


def test_prefix_of_a_file_is_enough_without_a_file_size(good_file: Path) -> None:
    content = good_file.read_bytes()
    (length,) = struct.unpack("<Q", content[:8])
    header = read_header_bytes(content[: 8 + length])
    assert "mask" in header.tensors


def test_header_without_metadata_and_with_null_metadata() -> None:
    plain = _raw({"w": _tensor()}, bytes(16))
    assert read_header_bytes(plain, file_size=len(plain)).metadata == {}
    assert read_header_bytes(_raw({"__metadata__": None, "w": _tensor()}, bytes(16))).metadata == {}


def test_file_shorter_than_8_bytes(tmp_path: Path) -> None:
    with pytest.raises(HeaderError, match=r"file is 5 bytes, shorter than the 8-byte header length"):
        read_header(_write(tmp_path, b"\x01\x02\x03\x04\x05"))


def test_huge_declared_header_is_refused_before_reading_it(tmp_path: Path) -> None:
    path = _write(tmp_path, _raw(b"{}", declared=2**40))
    with pytest.raises(HeaderError, match=r"declared header length 1099511627776 bytes is over the limit"):
        read_header(path)
    with pytest.raises(HeaderError, match=r"over the limit of 24 bytes"):
        read_header_bytes(_raw({"w": _tensor()}, bytes(16)), max_header_bytes=24)


def test_declared_header_longer_than_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, _raw(b"{}", declared=500))
    with pytest.raises(HeaderError, match=r"declared header length 500 bytes goes past the end of the 10-byte file"):
        read_header(path)


def test_header_cut_short_in_a_stream_without_size() -> None:
    class Unseekable(io.RawIOBase):
        def __init__(self, content: bytes) -> None:
            self._inner = io.BytesIO(content)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
            return self._inner.readinto(buffer)

    stream = io.BufferedReader(Unseekable(_raw(b"{}", declared=100)))
    with pytest.raises(HeaderError, match=r"file truncated: the header declares 100 bytes but only 2 follow"):
        read_header(stream)


def test_partial_bytes_name_what_is_missing() -> None:
    content = _raw({"w": _tensor()}, bytes(16))
    with pytest.raises(HeaderError, match=r"only 10 were given; accepted: at least the first"):
        read_header_bytes(content[:18])


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"\xff\xfe not utf8", r"header is not JSON"),
        (b"{not json", r"header is not JSON"),
        (b"[1, 2]", r"header is a JSON list, not an object"),
        ({"__metadata__": ["a"]}, r"__metadata__ is a JSON list; accepted: an object of str -> str"),
        ({"__metadata__": {"epochs": 3}}, r"__metadata__ value of 'epochs' is int; accepted: str -> str only"),
        ({"w": [1, 2]}, r"tensor 'w' is described by a JSON list"),
        ({"w": _tensor(dtype="F12")}, r"tensor 'w' has unknown dtype 'F12'; accepted: BOOL, F4"),
        ({"w": _tensor(shape=[2, -2])}, r"tensor 'w' has shape \[2, -2\]; accepted: a list of non-negative"),
        ({"w": _tensor(shape=[2, True])}, r"has shape \[2, True\]"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, r"data_offsets \[0\]; accepted: \[start, end\]"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}, r"data_offsets \[0, '8'\]"),
        ({"w": _tensor(start=16, end=0)}, r"data_offsets \[16, 0\]: end before start"),
        ({"w": _tensor(end=12)}, r"spans 12 bytes but shape \[2, 2\] of F32 needs 16 bytes; the offsets lie"),
        ({"w": _tensor(dtype="F4", shape=[3], end=2)}, r"shape \[3\] of F4 needs 1.5 bytes"),
    ],
)
def test_malformed_headers_are_named(header: object, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        read_header_bytes(_raw(header, bytes(64)))


def test_tensor_beyond_the_end_of_the_file_means_truncated(tmp_path: Path, good_file: Path) -> None:
    content = good_file.read_bytes()
    cut = _write(tmp_path, content[:-10], "cut.safetensors")
    with pytest.raises(HeaderError, match=r"cut.safetensors: tensor .* ends at data byte \d+ but the file holds"):
        read_header(cut)
    with pytest.raises(HeaderError, match=r"file truncated"):
        read_header_bytes(content, file_size=len(content) - 1)


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = {"a": _tensor(start=0, end=16), "b": _tensor(start=8, end=24)}
    with pytest.raises(HeaderError, match=r"tensors 'a' and 'b' overlap at data byte 8"):
        read_header(_write(tmp_path, _raw(header, bytes(24))))


def test_empty_tensors_may_share_an_offset() -> None:
    header = {"a": _tensor(shape=[0], start=0, end=0), "b": _tensor(shape=[4], start=0, end=16)}
    assert read_header_bytes(_raw(header, bytes(16))).tensors["a"].numel == 0


def test_unreadable_path_is_a_header_error(tmp_path: Path) -> None:
    with pytest.raises(HeaderError, match=r"cannot read safetensors file .*missing.safetensors"):
        read_header(tmp_path / "missing.safetensors")


def test_bytes_written_by_safetensors_round_trip() -> None:
    content = save({"x": np.arange(6, dtype=np.int64).reshape(2, 3)}, metadata={"format": "pt"})
    header = read_header_bytes(content, file_size=len(content))
    assert header.tensors["x"].dtype == "I64"
    assert header.tensors["x"].numel == 6


@pytest.mark.parametrize("role", ["lying-header", "lying-shape"])
def test_the_hubs_own_header_reader_accepts_files_ours_refuses(hub, fixtures, role: str) -> None:
    # Why lora_catalog checks what huggingface_hub parses: its remote header parser (the library made for
    # reading a header by Range) takes a file whose offsets lie, and safetensors' safe_open needs the whole
    # file. checked_header refuses the same header from the Range reads alone, before anything is downloaded.
    from huggingface_hub import HfApi

    from lora_catalog.hub import HubSource

    repo = fixtures[role]
    source = HubSource(endpoint=hub.url, timeout_s=5)
    entry = source.resolve(repo)
    theirs = HfApi(endpoint=hub.url).parse_safetensors_file_metadata(repo, entry.weight_name)
    assert theirs.tensors  # parsed without complaint
    with pytest.raises(HeaderError, match=r"the offsets lie about the data"):
        source.read_remote_header(entry)
