"""`AdapterSource`: a located LoRA (a Hub repo's file or pair, a local file or pair folder, a Civitai version) as
the resolver (`engine.prepare.resolve`) found it, before any download."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.formats.adapters import AdapterKey
from engine.prepare.civitai import CivitaiLocation
from lora_catalog.entries import Family
from lora_catalog.hints import LoraHints

__all__ = ["AdapterSource"]


@dataclass(frozen=True)
class AdapterSource:
    """A located adapter file: its identity, size and what it declares, before any download."""

    key: AdapterKey
    ref: str
    size: int | None
    declared_bases: tuple[str, ...]
    local_path: Path | None = None
    # Said to the user with the result, e.g. that the Hub metadata is stale (served while the Hub is down).
    warnings: tuple[str, ...] = ()
    # The pivotal-tuning embeddings file that goes with the LoRA, if its repo or folder has one.
    embeddings_name: str | None = None
    embeddings_size: int | None = None
    embeddings_path: Path | None = None
    # What its catalogue entry recommends (its card or Civitai page, a speed LoRA's repo or name).
    hints: LoraHints = field(default_factory=LoraHints)
    # A family its source states outright, even one no pool serves (Civitai's base label): it decides routing.
    declared_family: Family | None = None
    # The fine-tune it was trained for when that is not its family's base (Civitai's "Pony", ...): running it on
    # a pool of another base is said with the result.
    finetune: str | None = None
    # Where a Civitai LoRA is downloaded from (None for the Hub and local files).
    civitai: CivitaiLocation | None = None
    # A pair's second file (a local folder of two: a two-stage pool's high- and low-noise files), beside
    # `local_path`; which is which the pool's family reads (engine.prepare.stages).
    pair_path: Path | None = None
    # A Hub pair's two files (`lora_catalog.pairs`), downloaded each on its own (its key's weight name is both).
    halves: tuple[str, str] | None = None
