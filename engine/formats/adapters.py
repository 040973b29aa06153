"""Turning a LoRA file into a prepared adapter: per-layer updates mapped to the weights they change.

Names are converted by diffusers' own code (the served family's converter, a `lora_state_dict`, handles
kohya/SGM/XLabs names and network alphas; its state-dict utilities give PEFT names; `engine.formats.naming`
sends LyCORIS and DoRA names the same way), then each module's tensors are matched
by name and shape to a weight of the pipeline, once. A plain LoRA module becomes a
`LayerFactors`; LoHa/LoKr/Tucker modules an `engine.formats.lycoris` layer; a DoRA magnitude
wraps either in an `engine.formats.dora.DoraUpdate`; a full difference (`.diff`, `.diff_b`, `.diff_m`, on a
family that places them) an `engine.formats.differences.FullDifference`. A swap later is a loop over these
updates with no module surgery.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.devices import same_device
from engine.errors import AdapterLoadError, IncompatibleLoraError, LimitExceededError, UnsupportedLoraVariantError
from engine.formats.bounds import Reach, reach
from engine.formats.deltas import keep_deltas
from engine.formats.differences import DIFFERENCE, difference_layers, split_differences
from engine.formats.dora import dora_update
from engine.formats.layers import LayerFactors, LayerUpdate
from engine.formats.lycoris import lycoris_layer
from engine.formats.naming import SplitTensors, is_kohya, peft_stem, split_tensors
from engine.formats.pivotal import TokenEmbeddings
from engine.formats.plain import ACCEPTED, pattern_value, plain_layers, target, unplaced
from engine.formats.split import family_modules, split_layers
from engine.formats.targets import TargetTable
from engine.hostmem import pinned_nbytes
from lora_catalog.hints import LoraHints
from lora_catalog.variants import unsupported_variant, variant_tensors

__all__ = ["AdapterKey", "LayerFactors", "LayerUpdate", "PreparedAdapter", "detect_variant", "prepare"]

logger = logging.getLogger(__name__)

_ADAPTER_METADATA_KEY = "lora_adapter_metadata"
_DOWN_SUFFIXES = (".lora_down.weight", ".lora_A.weight", ".lora.down.weight", "_lora.down.weight", ".down.weight")
_RANK_SUFFIXES = (*_DOWN_SUFFIXES, ".hada_w1_b", ".hada_w2_b", ".lokr_w1_b", ".lokr_w2_b")


@dataclass(frozen=True)
class AdapterKey:
    """Identifies one adapter file's content: where it is and at which revision."""

    source: str
    name: str
    revision: str
    weight_name: str

    def __str__(self) -> str:
        return f"{self.name}@{self.revision[:10]}:{self.weight_name}"


@dataclass(frozen=True, eq=False)
class PreparedAdapter:
    key: AdapterKey
    layers: tuple[LayerUpdate, ...]
    file_size: int
    max_rank: int
    components: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    # Pivotal-tuning tokens that come with the LoRA (engine.formats.pivotal); kept on the host, tiny.
    embeddings: TokenEmbeddings | None = None
    # What the file says of itself (a speed LoRA's name, its training CLIP skip), and its hash as A1111 writes it.
    hints: LoraHints = dataclasses.field(default_factory=LoraHints)
    file_hash: str = ""
    # Per layer, how far it can move its weight (engine.formats.bounds), bounded once here so that a swap need
    # not read its fused weights back; empty (an adapter built elsewhere): every weight it touches is checked.
    reach: tuple[Reach, ...] = ()
    # A pair's files as a recipe names them (`high: a.safetensors, low: b.safetensors`: engine.prepare.stages);
    # empty for one file.
    files: str = ""
    # An IC-LoRA's `reference_downscale_factor` metadata as written (None: the file has none): the in-context
    # factor it was trained with, judged per request with a reference video (`engine.video_references`).
    trained_downscale: str | None = None
    # The sibling checkpoint of the served base it was made for (`engine.families.origin.made_for_sibling`): the
    # steps and guidance its card recommends are that checkpoint's, and not used here (`LoraHints.for_a_sibling`).
    sibling: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held; a factor several layers share (a fused layer's down factor, split by diffusers' FLUX
        converter into q, k and v) counted once."""
        extra = self.embeddings.nbytes if self.embeddings is not None else 0
        unique = {_view(t): t.nbytes for layer in self.layers for t in layer.tensors}
        return extra + sum(unique.values())

    @property
    def pinned_bytes(self) -> int:
        """Bytes held once pinned: each tensor at what pinning it takes (`engine.hostmem.pinned_nbytes`)."""
        extra = self.embeddings.nbytes if self.embeddings is not None else 0
        unique = {_view(t): pinned_nbytes(t.nbytes) for layer in self.layers for t in layer.tensors}
        return extra + sum(unique.values())

    @property
    def device(self) -> torch.device:
        return self.layers[0].tensors[0].device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the factors are kept in (the file's; the fuse reads them in float32)."""
        return self.layers[0].tensors[0].dtype

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of layer update it holds, e.g. ("DoraUpdate", "LayerFactors")."""
        return tuple(sorted({type(layer).__name__ for layer in self.layers}))

    def to(self, device: torch.device, dtype: torch.dtype | None = None, *, pin: bool = False) -> PreparedAdapter:
        """A copy on `device` (floating tensors in `dtype` when given); this adapter itself when nothing changes."""
        tensors = [t for layer in self.layers for t in layer.tensors]
        if all(same_device(t.device, device) and (dtype is None or t.dtype == dtype) for t in tensors) and not pin:
            return self

        moved: dict[tuple, torch.Tensor] = {}  # a shared factor stays shared on the other side

        def move(t: torch.Tensor) -> torch.Tensor:
            if (key := _view(t)) not in moved:
                kind = dtype if dtype is not None and t.is_floating_point() else t.dtype
                if pin:  # straight into pinned memory: one copy, not a pageable one then a pinned one
                    moved[key] = torch.empty(t.shape, dtype=kind, device=device, pin_memory=True).copy_(t)
                else:
                    # To a GPU from pinned memory this queues without waiting (about 1,400 stream syncs per SDXL
                    # LoRA otherwise); from pageable memory torch stages it and returns once the source is read.
                    moved[key] = t.to(device=device, dtype=kind, non_blocking=device.type != "cpu")
            return moved[key]

        return dataclasses.replace(self, layers=tuple(layer.map(move) for layer in self.layers))


def _view(t: torch.Tensor) -> tuple:
    """What identifies a tensor's values: its storage and the view into it."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def detect_variant(tensor_names: Iterable[str]) -> str | None:
    """The name of an adapter variant the fused swap cannot apply (OFT, IA3, ...), or None when it can."""
    return unsupported_variant(tensor_names)


def max_rank_of(shapes: Mapping[str, tuple[int, ...]]) -> int:
    ranks = [shape[0] for name, shape in shapes.items() if name.endswith(_RANK_SUFFIXES) and shape]
    return max(ranks, default=0)


def prepare(
    path: Path,
    key: AdapterKey,
    table: TargetTable,
    *,
    max_rank: int,
    metadata: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    delta_budget: int = 0,
) -> PreparedAdapter:
    """Load a validated safetensors adapter and map it onto `table`; the file's header was read already.

    `delta_budget`: the most bytes of float32 ΔW to precompute for the adapter's LoHa and DoRA layers (0: none);
    see `engine.formats.deltas` for why.
    """
    label = f"LoRA {key.name!r} ({key.weight_name})"
    # Full differences are placed where the family places them (Wan's), not refused here.
    checked = [name for name in shapes if table.full_differences is None or not DIFFERENCE.search(name)]
    if variant := detect_variant(checked):
        # Named, so that the uploader sees which tensors to drop (an OFT block, a FLUX file's `.diff`).
        found = variant_tensors(checked, variant)
        named = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise UnsupportedLoraVariantError(
            f"{label} uses {variant}, which the fused swap cannot apply; accepted: {ACCEPTED}; its {variant}: {named}"
        )
    rank = max_rank_of(shapes)
    if rank > max_rank:
        raise LimitExceededError(f"{label} has rank {rank}; accepted: rank up to {max_rank}")
    try:
        # Only the tensors of `shapes` (the header's, less any a fallen-back LoRA drops: engine.families.origin).
        tensors = {name: t for name, t in load_file(str(path), device="cpu").items() if name in shapes}
    except (SafetensorError, OSError) as e:
        raise AdapterLoadError(f"{label} could not be read: {e}") from e
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.numel() and not _finite(tensor):
            raise AdapterLoadError(f"{label} holds NaN or infinite values in {name!r}; accepted: finite weights only")
    config = _adapter_config(metadata, label)
    differences, tensors = split_differences(tensors, table)
    split = split_tensors(tensors)
    magnitudes = _magnitudes(split, table, label)
    layers: list[LayerUpdate] = []
    warnings: tuple[str, ...] = ()
    if split.plain:
        plain, warnings = plain_layers(split.plain, table, config, label)
        layers.extend(plain)
    layers.extend(_lycoris_layers(split, table, config, label))
    layers = [_with_magnitude(layer, magnitudes, table, label) for layer in layers]
    layers.extend(difference_layers(differences, table, label))  # a magnitude never rescales a full difference
    if magnitudes:
        names = ", ".join(table.names[i] for i in sorted(magnitudes)[:5])
        raise IncompatibleLoraError(f"{label} has DoRA magnitudes without LoRA factors for {names}")
    if not layers:  # no key of the file lands on the pool's modules, whichever converter read it
        raise unplaced(label, tensors)
    components = tuple(c for c in table.components if any(table.names[x.target].startswith(f"{c}.") for x in layers))
    layers = keep_deltas(layers, table.shapes, delta_budget)
    reaches = tuple(reach(layer) for layer in layers)
    size = path.stat().st_size
    return PreparedAdapter(key, tuple(layers), size, rank, components, warnings=warnings, reach=reaches)


def _finite(tensor: torch.Tensor) -> bool:
    if tensor.element_size() == 1:
        # float8 has no aminmax kernel (NotImplementedError); float16 holds every float8 value, NaN and inf included.
        tensor = tensor.to(torch.float16)
    # One pass, no copy: min and max propagate NaN and show either infinity (isfinite().all() is 3x slower).
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _adapter_config(metadata: Mapping[str, str], label: str) -> dict[str, dict]:
    """diffusers' `lora_adapter_metadata`, split per component (LoraConfig, LoHaConfig or LoKrConfig fields)."""
    raw = metadata.get(_ADAPTER_METADATA_KEY)
    if not raw:
        return {}
    try:
        flat = json.loads(raw)
    except json.JSONDecodeError as e:
        raise AdapterLoadError(f"{label} has malformed {_ADAPTER_METADATA_KEY!r} metadata: {e}") from e
    if not isinstance(flat, dict):
        raise AdapterLoadError(f"{label} has {_ADAPTER_METADATA_KEY!r} metadata that is not a JSON object")
    per: dict[str, dict] = {}
    for name, value in flat.items():
        component, _, field = name.rpartition(".")
        per.setdefault(component, {})[field] = value
    return per


def _lycoris_layers(split: SplitTensors, table: TargetTable, config: Mapping, label: str) -> list[LayerUpdate]:
    named = family_modules(sorted(split.lycoris), table)
    kohya = table.kohya_modules([s for s in split.lycoris if is_kohya(s) and s not in named], label)
    layers: list[LayerUpdate] = []
    for stem, params in sorted(split.lycoris.items()):
        if stem in named:
            layers.extend(split_layers(named[stem], params, table, where=f"{label}: {stem}"))
            continue
        candidates = [kohya[stem]] if stem in kohya else peft_stem(stem, table.components)
        index = target(table, candidates, label, stem)
        component = table.names[index].partition(".")[0]
        where = f"{label}: {table.names[index]}"
        alpha: float | None = float(params["alpha"].item()) if "alpha" in params else None
        rank: float | None = None
        peft = stem not in kohya
        settings = config.get(component)
        if peft and settings:
            # PEFT's LoHaConfig/LoKrConfig, as diffusers-style metadata carries a LoraConfig: r, alpha and patterns.
            module = table.names[index].partition(".")[2]
            rank = _optional_float(pattern_value(settings.get("rank_pattern"), module, settings.get("r")))
            alpha = _optional_float(pattern_value(settings.get("alpha_pattern"), module, settings.get("alpha", alpha)))
        shape = tuple(table.shapes[index])
        layers.append(lycoris_layer(index, params, shape, alpha=alpha, rank=rank, peft=peft, where=where))
    return layers


def _magnitudes(split: SplitTensors, table: TargetTable, label: str) -> dict[int, tuple]:
    """DoRA magnitudes by target index, with whether they follow PEFT's layout."""
    found: dict[int, tuple] = {}
    kohya = table.kohya_modules([s for s in sorted(split.kohya_magnitudes) if is_kohya(s)], label)
    components = table.components
    for stem, tensor in split.kohya_magnitudes.items():
        # `dora_scale` (LyCORIS) may lie on either axis; its shape tells which.
        candidates = [kohya[stem]] if stem in kohya else peft_stem(stem, components)
        found[target(table, candidates, label, stem)] = (tensor, False)
    for stem, tensor in split.peft_magnitudes.items():
        found[target(table, peft_stem(stem, components), label, stem)] = (tensor, True)
    return found


def _with_magnitude(layer: LayerUpdate, magnitudes: dict[int, tuple], table: TargetTable, label: str) -> LayerUpdate:
    if layer.target not in magnitudes:
        return layer
    magnitude, peft = magnitudes.pop(layer.target)
    shape = tuple(table.shapes[layer.target])
    return dora_update(layer, magnitude, shape, peft=peft, where=f"{label}: {table.names[layer.target]}")


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
