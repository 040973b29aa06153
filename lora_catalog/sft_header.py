"""Safetensors headers, parsed by huggingface_hub and checked strictly here (no torch).

huggingface_hub parses headers (locally and by HTTP Range) but trusts them: offsets that lie, tensors past a
truncated end, overlaps and unknown dtypes all pass, and safetensors' `safe_open` checks only with the whole
file. So this module keeps what the library does not do: the 8-byte length against our limit and the file's
size before the library reads, and a strict check of the library's result, each naming the problem. Bytes and
streams (a Range-read prefix) have no library reader and are decoded here into its types. Why each check
matters: docs/internals.md and tests/lora_catalog/test_header.py.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from huggingface_hub import parse_local_safetensors_file_metadata
from huggingface_hub.errors import SafetensorsParsingError
from huggingface_hub.utils import SafetensorsFileMetadata
from huggingface_hub.utils import TensorInfo as HubTensorInfo

from .errors import HeaderError

__all__ = [
    "DEFAULT_MAX_HEADER_BYTES",
    "DTYPE_BITS",
    "SafetensorsHeader",
    "TensorInfo",
    "addnet_hash",
    "checked_header",
    "declared_length",
    "read_header",
    "read_header_bytes",
    "unparsed_header",
]

DEFAULT_MAX_HEADER_BYTES = 16 * 2**20
# Bits per element for every dtype safetensors 0.8 writes (sub-byte floats included).
DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {
        "BOOL": 8,
        "F4": 4,
        "F6_E2M3": 6,
        "F6_E3M2": 6,
        "U8": 8,
        "I8": 8,
        "F8_E5M2": 8,
        "F8_E4M3": 8,
        "F8_E8M0": 8,
        "I16": 16,
        "U16": 16,
        "F16": 16,
        "BF16": 16,
        "I32": 32,
        "U32": 32,
        "F32": 32,
        "C64": 64,
        "F64": 64,
        "I64": 64,
        "U64": 64,
    }
)
_PREFIX = 8


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies; `start`/`end` are relative to `SafetensorsHeader.data_start`."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: tensors by name, the free-form metadata and where the data begins."""

    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str]
    header_size: int
    data_start: int

    @property
    def data_size(self) -> int:
        """Bytes of tensor data the header accounts for."""
        return max((t.end for t in self.tensors.values()), default=0)


def read_header(
    source: Path | BinaryIO,
    *,
    file_size: int | None = None,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    label: str | None = None,
) -> SafetensorsHeader:
    """Read and check the header of a safetensors file (a path or a binary stream positioned at its start).

    `file_size` defaults to the file's size (or the stream's, when it can seek); tensors are checked to lie
    within it. Errors name the file by `label`, by default its path (pass a label where the message reaches
    users who must not see the server's paths).
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        label = str(path) if label is None else label
        try:
            with path.open("rb") as stream:
                size = os.fstat(stream.fileno()).st_size if file_size is None else file_size
                length = declared_length(stream.read(_PREFIX), label, size, max_header_bytes)
            parsed = parse_local_safetensors_file_metadata(path)
        except HeaderError:
            raise
        except OSError as e:
            raise HeaderError(f"cannot read safetensors file {label!r}: {e.strerror or e}") from e
        except (SafetensorsParsingError, AttributeError, TypeError, ValueError) as e:
            raise unparsed_header(e, label) from e
        return checked_header(parsed, header_size=length, file_size=size, label=label)
    label = str(getattr(source, "name", "<stream>")) if label is None else label
    stream_size = file_size if file_size is not None else _stream_size(source)
    length = declared_length(source.read(_PREFIX), label, stream_size, max_header_bytes)
    raw = source.read(length)
    if len(raw) < length:
        raise HeaderError(f"{label}: file truncated: the header declares {length} bytes but only {len(raw)} follow")
    return checked_header(_decode(raw, label), header_size=length, file_size=stream_size, label=label)


def addnet_hash(path: Path) -> str:
    """A LoRA file's hash as A1111 writes it in `Lora hashes` (its first 12 hex digits; Civitai's AutoV3).

    kohya's sd-scripts `addnet_hash_safetensors`, which A1111 uses for safetensors LoRAs: the sha256 of the file
    after its header, so editing the metadata does not change it. Read once, by 1 MiB blocks. Its own few lines,
    as neither library is a dependency here.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        file.seek(8 + length)
        for block in iter(lambda: file.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_header_bytes(
    data: bytes,
    *,
    file_size: int | None = None,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    label: str = "<bytes>",
) -> SafetensorsHeader:
    """Check a header from the first bytes of a file (a remote Range read, say).

    `data` must hold at least the 8-byte prefix and the whole JSON header. Pass `file_size` (the whole
    file's size, e.g. from `Content-Range`) to have tensors checked against the end of the file; for a
    complete file pass `len(data)`.
    """
    length = declared_length(bytes(data[:_PREFIX]), label, file_size, max_header_bytes)
    raw = data[_PREFIX : _PREFIX + length]
    if len(raw) < length:
        raise HeaderError(
            f"{label}: the header declares {length} bytes but only {len(raw)} were given; "
            f"accepted: at least the first {_PREFIX + length} bytes of the file"
        )
    return checked_header(_decode(bytes(raw), label), header_size=length, file_size=file_size, label=label)


def declared_length(prefix: bytes, label: str, file_size: int | None, max_header_bytes: int) -> int:
    """The header length the 8-byte prefix declares, refused over `max_header_bytes` or past the file's end."""
    if len(prefix) < _PREFIX:
        raise HeaderError(
            f"{label}: file is {len(prefix)} bytes, shorter than the 8-byte header length; accepted: a safetensors file"
        )
    (length,) = struct.unpack("<Q", prefix[:_PREFIX])
    if length > max_header_bytes:
        raise HeaderError(
            f"{label}: declared header length {length} bytes is over the limit of {max_header_bytes} bytes; "
            "accepted: a safetensors file with a sane header"
        )
    if file_size is not None and _PREFIX + length > file_size:
        raise HeaderError(
            f"{label}: declared header length {length} bytes goes past the end of the {file_size}-byte file"
        )
    return length


def checked_header(
    parsed: SafetensorsFileMetadata, *, header_size: int, file_size: int | None, label: str
) -> SafetensorsHeader:
    """huggingface_hub's parse of a header, checked: metadata str -> str, each tensor's dtype, shape and
    offsets consistent, within the file (when its size is known) and overlapping no other."""
    metadata = _metadata(parsed.metadata, label)
    data_start = _PREFIX + header_size
    data_size = None if file_size is None else file_size - data_start
    tensors = {name: _tensor(name, info, label, data_size) for name, info in parsed.tensors.items()}
    _check_overlaps(tensors, label)
    return SafetensorsHeader(
        tensors=MappingProxyType(tensors),
        metadata=MappingProxyType(metadata),
        header_size=header_size,
        data_start=data_start,
    )


def _decode(raw: bytes, label: str) -> SafetensorsFileMetadata:
    """Header bytes into the library's types (what its own parser does, with the shape of the JSON checked)."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeaderError(f"{label}: header is not JSON ({e}); accepted: a UTF-8 JSON object") from e
    if not isinstance(header, dict):
        raise HeaderError(f"{label}: header is a JSON {type(header).__name__}, not an object")
    specs = {name: spec for name, spec in header.items() if name != "__metadata__"}
    for name, spec in specs.items():
        if not isinstance(spec, dict):
            raise HeaderError(
                f"{label}: tensor {name!r} is described by a JSON {type(spec).__name__}; accepted: an object"
            )
    metadata: Any = header.get("__metadata__")
    try:
        # Values as found (checked by checked_header); the library computes parameter counts from them.
        return SafetensorsFileMetadata(
            metadata=metadata,
            tensors={
                name: HubTensorInfo(
                    dtype=spec.get("dtype"), shape=spec.get("shape"), data_offsets=spec.get("data_offsets")
                )
                for name, spec in specs.items()
            },
        )
    except (TypeError, ValueError) as e:
        raise unparsed_header(e, label) from e


def unparsed_header(error: Exception, label: str) -> HeaderError:
    """A header huggingface_hub could not parse (it raises SafetensorsParsingError, or a TypeError or
    AttributeError on JSON of another shape); its own message may name the server's path, so it is left out."""
    cause = error.__cause__ if isinstance(error.__cause__, json.JSONDecodeError) else None
    why = f"header is not JSON ({cause})" if cause else f"header format not recognized ({type(error).__name__})"
    return HeaderError(f"{label}: {why}; accepted: a JSON object of tensor name -> dtype, shape and data_offsets")


def _stream_size(stream: BinaryIO) -> int | None:
    if not stream.seekable():
        return None
    here = stream.tell()
    end = stream.seek(0, os.SEEK_END)
    stream.seek(here)
    return end - here


def _metadata(raw: object, label: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise HeaderError(f"{label}: __metadata__ is a JSON {type(raw).__name__}; accepted: an object of str -> str")
    bad = [key for key, value in raw.items() if not isinstance(value, str)]
    if bad:
        raise HeaderError(
            f"{label}: __metadata__ value of {bad[0]!r} is {type(raw[bad[0]]).__name__}; accepted: str -> str only"
        )
    return dict(raw)


def _tensor(name: str, info: HubTensorInfo, label: str, data_size: int | None) -> TensorInfo:
    where = f"{label}: tensor {name!r}"
    dtype: Any = info.dtype
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError(f"{where} has unknown dtype {dtype!r}; accepted: {', '.join(DTYPE_BITS)}")
    shape: Any = info.shape
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise HeaderError(f"{where} has shape {shape!r}; accepted: a list of non-negative integers")
    # The library makes a tuple of whatever the JSON held; shown as the JSON list it was.
    offsets: Any = list(info.data_offsets) if isinstance(info.data_offsets, list | tuple) else info.data_offsets
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets):
        raise HeaderError(f"{where} has data_offsets {offsets!r}; accepted: [start, end], non-negative integers")
    start, end = offsets
    if end < start:
        raise HeaderError(f"{where} has data_offsets [{start}, {end}]: end before start")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or end - start != bits // 8:
        raise HeaderError(
            f"{where} spans {end - start} bytes but shape {shape} of {dtype} needs {bits / 8:g} bytes; "
            "the offsets lie about the data"
        )
    if data_size is not None and end > data_size:
        raise HeaderError(
            f"{where} ends at data byte {end} but the file holds {max(data_size, 0)} data bytes: file truncated"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), start=start, end=end)


def _check_overlaps(tensors: Mapping[str, TensorInfo], label: str) -> None:
    spans = sorted((t.start, t.end, name) for name, t in tensors.items() if t.end > t.start)
    for (_, prev_end, prev_name), (start, _, name) in itertools.pairwise(spans):
        if start < prev_end:
            raise HeaderError(f"{label}: tensors {prev_name!r} and {name!r} overlap at data byte {start}")


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
