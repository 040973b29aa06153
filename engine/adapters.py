"""Turning a LoRA file into a prepared adapter: factors mapped to the weights they change.

Names are converted by diffusers' own code (`lora_state_dict` handles kohya/SGM
names and network alphas; its state-dict utilities give PEFT names), then each
module's factors are matched by name and shape to a weight of the pipeline, once.
A swap later is a loop over these factors with no module surgery.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import StableDiffusionXLPipeline
from diffusers.utils.state_dict_utils import (
    convert_state_dict_to_diffusers,
    convert_state_dict_to_peft,
    convert_unet_state_dict_to_peft,
)
from peft.utils.other import get_pattern_key
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from .errors import AdapterLoadError, IncompatibleLoraError, LimitExceededError, UnsupportedLoraVariantError

__all__ = ["COMPONENTS", "AdapterKey", "LayerFactors", "PreparedAdapter", "TargetTable", "detect_variant", "prepare"]

logger = logging.getLogger(__name__)

COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
_ADAPTER_METADATA_KEY = "lora_adapter_metadata"
# Key patterns of LoRA variants the fused low-rank swap cannot apply, and their names.
_VARIANTS = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"hada_w[12]_[ab]$", "LoHa"),
        (r"lokr_w[12](_[ab])?$", "LoKr"),
        (r"(dora_scale|lora_magnitude_vector)$", "DoRA"),
        (r"oft_(blocks|diag)", "OFT"),
        (r"lora_mid\.", "LoCon with a Tucker (CP) decomposition"),
        (r"\.diff(_b)?$", "a full weight difference"),
        (r"\.on_input$", "IA3"),
        (r"(lora_B|lora_up)\.bias$", "LoRA with bias terms"),
    )
)
_DOWN_SUFFIXES = (".lora_down.weight", ".lora_A.weight", ".lora.down.weight", "_lora.down.weight", ".down.weight")


@dataclass(frozen=True)
class AdapterKey:
    """Identifies one adapter file's content: where it is and at which revision."""

    source: str
    name: str
    revision: str
    weight_name: str

    def __str__(self) -> str:
        return f"{self.name}@{self.revision[:10]}:{self.weight_name}"


@dataclass(frozen=True)
class LayerFactors:
    """`W += scale * scaling * up @ down`, with both factors flattened to 2-D."""

    target: int
    down: torch.Tensor
    up: torch.Tensor
    scaling: float


@dataclass(frozen=True, eq=False)
class PreparedAdapter:
    key: AdapterKey
    layers: tuple[LayerFactors, ...]
    file_size: int
    max_rank: int
    components: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(f.down.nbytes + f.up.nbytes for f in self.layers)

    @property
    def device(self) -> torch.device:
        return self.layers[0].down.device

    def to(self, device: torch.device, dtype: torch.dtype, *, pin: bool = False) -> PreparedAdapter:
        """A copy on `device` in `dtype` (this adapter itself when nothing changes)."""
        first = self.layers[0].down
        if first.device == device and first.dtype == dtype and not pin:
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            moved = t.to(device=device, dtype=dtype, non_blocking=True)
            return moved.pin_memory() if pin else moved

        layers = tuple(LayerFactors(f.target, move(f.down), move(f.up), f.scaling) for f in self.layers)
        return dataclasses.replace(self, layers=layers)


class TargetTable:
    """Every Linear/Conv2d weight a LoRA may change, indexed once per pipeline."""

    def __init__(self, components: Mapping[str, nn.Module]) -> None:
        self.params: list[torch.Tensor] = []
        self._index: dict[tuple[str, str], int] = {}
        for component, model in components.items():
            for name, module in model.named_modules():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    self._index[(component, name)] = len(self.params)
                    self.params.append(module.weight)
        self._flat_text = {c: not hasattr(m, "text_model") for c, m in components.items()}

    def lookup(self, component: str, module: str) -> int | None:
        if self._flat_text.get(component):
            # Published CLIP LoRAs name modules under `text_model.`; recent transformers flattened it.
            module = module.removeprefix("text_model.")
        return self._index.get((component, module))

    def __len__(self) -> int:
        return len(self.params)


def detect_variant(tensor_names: Iterable[str]) -> str | None:
    """The name of an unsupported LoRA variant the keys belong to, or None for plain LoRA."""
    for name in tensor_names:
        for pattern, variant in _VARIANTS:
            if pattern.search(name):
                return variant
    return None


def max_rank_of(shapes: Mapping[str, tuple[int, ...]]) -> int:
    ranks = [shape[0] for name, shape in shapes.items() if name.endswith(_DOWN_SUFFIXES) and shape]
    return max(ranks, default=0)


def prepare(
    path: Path,
    key: AdapterKey,
    table: TargetTable,
    *,
    unet_config: object,
    max_rank: int,
    metadata: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
) -> PreparedAdapter:
    """Load a validated safetensors LoRA and map it onto `table`; the file's header was read already."""
    label = f"LoRA {key.name!r} ({key.weight_name})"
    if variant := detect_variant(shapes):
        raise UnsupportedLoraVariantError(
            f"{label} is a {variant} adapter; accepted: plain low-rank LoRA (kohya, PEFT or diffusers naming)"
        )
    rank = max_rank_of(shapes)
    if rank > max_rank:
        raise LimitExceededError(f"{label} has rank {rank}; accepted: rank up to {max_rank}")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as e:
        raise AdapterLoadError(f"{label} could not be read: {e}") from e
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.numel() and not _finite(tensor):
            raise AdapterLoadError(f"{label} holds NaN or infinite values in {name!r}; accepted: finite weights only")
    file_size = path.stat().st_size
    try:
        state_dict, network_alphas = StableDiffusionXLPipeline.lora_state_dict(tensors, unet_config=unet_config)
    except (ValueError, KeyError, IndexError) as e:
        raise IncompatibleLoraError(f"{label} has tensor names this SDXL pipeline does not know: {e}") from e
    config = _adapter_config(metadata, label)
    layers: list[LayerFactors] = []
    components = []
    for component in COMPONENTS:
        part = _component_state_dict(state_dict, component)
        if not part:
            continue
        components.append(component)
        alphas = _component_alphas(network_alphas, component)
        layers.extend(_factors(part, component, table, alphas, config.get(component), label))
    leftovers = [k for k in state_dict if not k.startswith(tuple(f"{c}." for c in COMPONENTS))]
    if leftovers or not layers:
        names = ", ".join(sorted(leftovers)[:5]) or ", ".join(sorted(tensors)[:5])
        raise IncompatibleLoraError(f"{label} has tensors that match no module of the served pipeline: {names}")
    return PreparedAdapter(key, tuple(layers), file_size, rank, tuple(components))


def _finite(tensor: torch.Tensor) -> bool:
    if tensor.element_size() == 1:
        # float8 has no aminmax kernel (NotImplementedError); float16 holds every float8 value, NaN and inf included.
        tensor = tensor.to(torch.float16)
    # One pass, no copy: min and max propagate NaN and show either infinity (isfinite().all() is 3x slower).
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _adapter_config(metadata: Mapping[str, str], label: str) -> dict[str, dict]:
    """diffusers' `lora_adapter_metadata`, split per component (LoraConfig fields)."""
    raw = metadata.get(_ADAPTER_METADATA_KEY)
    if not raw:
        return {}
    try:
        flat = json.loads(raw)
    except json.JSONDecodeError as e:
        raise AdapterLoadError(f"{label} has malformed {_ADAPTER_METADATA_KEY!r} metadata: {e}") from e
    if not isinstance(flat, dict):
        raise AdapterLoadError(f"{label} has {_ADAPTER_METADATA_KEY!r} metadata that is not a JSON object")
    if any(k.endswith(".use_dora") and v for k, v in flat.items()):
        raise UnsupportedLoraVariantError(f"{label} is a DoRA adapter; accepted: plain low-rank LoRA")
    per: dict[str, dict] = {}
    for name, value in flat.items():
        component, _, field = name.rpartition(".")
        per.setdefault(component, {})[field] = value
    return per


def _component_state_dict(state_dict: Mapping[str, torch.Tensor], component: str) -> dict[str, torch.Tensor]:
    prefix = f"{component}."
    part = {k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)}
    if not part:
        return part
    if component == "unet":
        return part if any("lora_A" in k for k in part) else convert_unet_state_dict_to_peft(part)
    if any("lora_A" in k for k in part):
        return part
    return convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))


def _component_alphas(network_alphas: Mapping[str, float] | None, component: str) -> dict[str, float]:
    prefix = f"{component}."
    alphas = {}
    for name, value in (network_alphas or {}).items():
        if name.startswith(prefix):
            module = name.removeprefix(prefix).removesuffix(".alpha")
            alphas[re.sub(r"\.lora(_linear_layer|_A|_B)?(\..*)?$", "", module)] = float(value)
    return alphas


def _factors(
    part: Mapping[str, torch.Tensor],
    component: str,
    table: TargetTable,
    alphas: Mapping[str, float],
    config: Mapping | None,
    label: str,
) -> list[LayerFactors]:
    modules = sorted({k.split(".lora_")[0] for k in part})
    common_alpha = Counter(alphas.values()).most_common(1)[0][0] if alphas else None
    out = []
    for module in modules:
        down, up = part.get(f"{module}.lora_A.weight"), part.get(f"{module}.lora_B.weight")
        if down is None or up is None:
            raise IncompatibleLoraError(f"{label} has an unpaired factor for {component}.{module}")
        index = table.lookup(component, module)
        if index is None:
            raise IncompatibleLoraError(f"{label} targets {component}.{module}, which the served pipeline lacks")
        weight = table.params[index]
        rank = down.shape[0]
        fits = (
            up.shape[:2] == (weight.shape[0], rank)
            and down.shape[1:] == weight.shape[1:]
            and all(s == 1 for s in up.shape[2:])
        )
        if not fits:
            raise IncompatibleLoraError(
                f"{label}: factors {tuple(up.shape)} x {tuple(down.shape)} do not fit "
                f"{component}.{module} of shape {tuple(weight.shape)}"
            )
        if config:
            alpha = float(_pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", rank)))
            denominator = math.sqrt(rank) if config.get("use_rslora") else rank
        else:
            alpha = alphas.get(module, common_alpha if common_alpha is not None else rank)
            denominator = rank
        out.append(LayerFactors(index, down.reshape(rank, -1), up.reshape(up.shape[0], rank), alpha / denominator))
    return out


def _pattern_value(patterns: Mapping | None, module: str, default: float) -> float:
    if not patterns:
        return default
    key = get_pattern_key(list(patterns), module)
    return patterns.get(key, default)
