"""Local LoRAs (`local:<path>` in LOCAL_LORA_DIR): a file, with its pivotal-tuning embeddings file if it has one,
or a folder of two (a two-stage pool's high- and low-noise pair). A file's size, modification time and name are
its revision, so a changed file is a new adapter."""

from __future__ import annotations

from pathlib import Path

from engine.errors import InvalidRequestError, LoraNotFoundError
from engine.prepare.keys import adapter_key
from engine.prepare.source import AdapterSource
from lora_catalog.local import local_embeddings

__all__ = ["locate_local"]


def locate_local(local_dir: Path | None, name: str) -> AdapterSource:
    """The file (or pair folder) `local:<name>` names, resolved and held inside `local_dir` (LOCAL_LORA_DIR): a
    path or link out of it is refused, and what is read is the resolved file."""
    ref = f"local:{name}"
    if local_dir is None:
        raise LoraNotFoundError(f"LoRA {ref!r} names a local file, but no LOCAL_LORA_DIR is configured")
    root = local_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise InvalidRequestError(f"LoRA {ref!r} points outside the local LoRA folder; accepted: files inside it")
    if path.is_dir():
        return _local_pair(ref, path, root)
    if not path.is_file():
        raise LoraNotFoundError(f"LoRA {ref!r} does not exist in the local LoRA folder")
    stat = path.stat()
    revision = f"{stat.st_size}-{stat.st_mtime_ns}"
    embeddings = local_embeddings(path)
    embeddings_size = None
    if embeddings is not None:
        # The pair is one adapter: a changed embeddings file is a new revision of it.
        emb_stat = embeddings.stat()
        embeddings_size = emb_stat.st_size
        revision += f"+{emb_stat.st_size}-{emb_stat.st_mtime_ns}"
    key = adapter_key(ref, revision, path.name)
    return AdapterSource(
        key,
        ref,
        stat.st_size,
        (),
        local_path=path,
        embeddings_name=embeddings.name if embeddings else None,
        embeddings_size=embeddings_size,
        embeddings_path=embeddings,
    )


def _local_pair(ref: str, folder: Path, root: Path) -> AdapterSource:
    """A local folder of two .safetensors files: one LoRA of two halves (a two-stage pool reads which is which).
    Each file is resolved and held as a single file is: a link out of `root` (LOCAL_LORA_DIR) is refused by name,
    and what is read is the resolved file. Its weight name is both files' (`a + b`), and a change to either is a new
    revision."""
    listed = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if len(listed) != 2:
        raise InvalidRequestError(
            f"LoRA {ref!r} is a folder of {len(listed)} .safetensors files; accepted: a file, or a folder of two "
            "(a high-noise and a low-noise file)"
        )
    files = [p.resolve() for p in listed]
    for link, path in zip(listed, files, strict=True):
        if not path.is_relative_to(root):
            raise InvalidRequestError(
                f"LoRA {ref!r}: its file {link.name!r} points outside the local LoRA folder; accepted: files inside it"
            )
    stats = [p.stat() for p in files]
    revision = "+".join(f"{s.st_size}-{s.st_mtime_ns}" for s in stats)
    key = adapter_key(ref, revision, " + ".join(p.name for p in files))
    size = sum(s.st_size for s in stats)
    return AdapterSource(key, ref, size, (), local_path=files[0], pair_path=files[1])
