"""A file's plain low-rank factors onto the served pipeline: diffusers' conversion (the family's converter), with
what each of the file's tensors became (`engine.formats.converted`), then each module's factors matched by name and
shape to a weight of the pipeline.

A file of which the converter drops a tensor (a name it does not know, popped or ignored) is refused, naming the
dropped tensors: diffusers would run it with part of the LoRA missing. The one exception is a part the family
declares its converter drops by design (`FamilySpec.unapplied_parts`: FLUX.1's T5, which diffusers' loader never
adapts): the file runs without it, as in diffusers, with a warning naming it. An `.alpha` the converter read is not
dropped (it is folded into the factors' scale). Every error names the file's own keys, not the names a converter
made of them (Qwen-Image's converter spells an unknown kohya name `transformer_blocks.j`).
Also the helpers every path of `engine.formats.adapters` shares: `target`, `pattern_value`, `unplaced`.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import torch
from peft.utils.other import get_pattern_key

from engine.errors import IncompatibleLoraError
from engine.families.spec import UnappliedPart
from engine.formats.converted import Converted, convert_traced, named
from engine.formats.layers import LayerDelta, LayerFactors, LayerUpdate
from engine.formats.naming import component_state_dict
from engine.formats.targets import TargetTable

__all__ = ["ACCEPTED", "pattern_value", "plain_layers", "target", "unplaced"]

logger = logging.getLogger(__name__)

# A factor's or alpha's ending, after its layer's name; and the shortest layer name matched in a converter's error.
_FACTOR = re.compile(r"[._](lora[._](down|up|A|B)|alpha)([._]default)?([._]weight)?$")
_LAYER_CHARS = 8

ACCEPTED = (
    "plain LoRA, LoCon, LoHa, LoKr (with or without Tucker cores) or DoRA, in kohya, PEFT or diffusers naming "
    "(full differences on Wan)"
)


def plain_layers(
    plain: Mapping[str, torch.Tensor], table: TargetTable, config: Mapping, label: str
) -> tuple[list[LayerUpdate], tuple[str, ...]]:
    """The layer updates of a file's plain factors (`plain`: the file's names), and the warnings for the parts of it
    not applied (`FamilySpec.unapplied_parts`); refused where any other is dropped."""
    try:
        converted = convert_traced(table.convert, plain)
    except IncompatibleLoraError as e:  # the converter found factors the served pipeline's shapes do not fit
        raise IncompatibleLoraError(f"{label}: {e}") from e
    except (ValueError, KeyError, IndexError) as e:
        # The tensors its error names first (diffusers' "should be empty but has …" lists what it did not read).
        raise unplaced(label, _mentioned(plain, str(e)) or plain, f" (its converter: {e})") from e
    rest, warnings = _unapplied(label, converted.dropped, table.unapplied_parts)
    if rest or (converted.dropped and len(converted.dropped) == len(plain)):
        raise _dropped(label, _outliers_first(rest or converted.dropped, plain), len(plain))
    state_dict = converted.state_dict
    layers: list[LayerUpdate] = []
    for component in table.components:
        part = component_state_dict(state_dict, component, denoiser=component == table.denoiser)
        if part:
            alphas = _component_alphas(converted.network_alphas, component)
            layers.extend(_factors(part, component, table, alphas, config.get(component), label, converted))
    leftovers = [k for k in state_dict if not k.startswith(tuple(f"{c}." for c in table.components))]
    if leftovers:
        raise unplaced(label, converted.origin(leftovers) or leftovers)
    return layers, warnings


def _unapplied(label: str, dropped: Sequence[str], parts: Sequence[UnappliedPart]) -> tuple[list[str], tuple[str, ...]]:
    """The dropped names of no part the family's converter drops by design, and a warning for each such part found:
    its count and first names, and that its text-encoder effect is not applied (diffusers runs the file so)."""
    rest, warnings = list(dropped), []
    for part in parts:
        names = [name for name in rest if name.startswith(part.prefixes)]
        if names:
            rest = [name for name in rest if name not in names]
            warnings.append(
                f"{label}: its {part.what} part ({len(names)} tensors: {named(names, 2)}) is not applied: the served "
                f"family's converter (diffusers') drops it and runs the LoRA without it, so its effect on the "
                f"{part.what} text encoder is missing"
            )
            logger.info("%s: its %s part (%d tensors) not applied, as diffusers drops it", label, part.what, len(names))
    return rest, tuple(warnings)


def _outliers_first(dropped: Sequence[str], names: Iterable[str]) -> list[str]:
    """The dropped names, those of the file's rarest naming first (`text_encoders.` among `diffusion_model.`: a
    pair of another naming can switch a converter away from the rest of the file, which it then drops too)."""
    counts = Counter(_naming(name) for name in names)
    return sorted(dropped, key=lambda name: (counts[_naming(name)], name))


def _naming(name: str) -> str:
    """A name's first part: its top-level module (`diffusion_model`, `transformer`) or kohya's `lora_unet_`."""
    kohya = re.match(r"lora_[a-z0-9]+_", name)
    return kohya.group() if kohya else name.partition(".")[0]


def _dropped(label: str, dropped: Sequence[str], total: int) -> IncompatibleLoraError:
    """The refusal of a file of which the served family's converter (diffusers') drops some tensors."""
    if len(dropped) == total:  # nothing of it read: a file for another model, or of no known naming
        return unplaced(label, dropped, " (the served family's converter reads none of them)")
    return IncompatibleLoraError(
        f"{label} has {len(dropped)} of its {total} tensors that the served family's converter does not read "
        f"(diffusers' would drop them, running part of the LoRA): {named(dropped)}; accepted: {ACCEPTED}, every "
        "tensor over the served pipeline's modules"
    )


def _mentioned(names: Iterable[str], text: str) -> list[str]:
    """The file's names whose layer `text` (a converter's error) names: as the file spells it, or with a prefix cut
    (diffusers cuts `diffusion_model.`'s length off every name) or the factors renamed (`lora_down` as `lora_A`)."""
    said = {_FACTOR.sub("", token) for token in re.findall(r"[\w.]+", text) if "." in token}
    said = {layer for layer in said if len(layer) >= _LAYER_CHARS}
    return [name for name in names if any(_FACTOR.sub("", name).endswith(layer) for layer in said)]


def unplaced(label: str, names: Iterable[str], why: str = "") -> IncompatibleLoraError:
    """The refusal of a file's tensors that land on no module of the served pipeline: named, with what is read."""
    return IncompatibleLoraError(
        f"{label} has tensors that match no module of the served pipeline: {named(sorted(names), 5)}{why}; "
        f"accepted: {ACCEPTED}, over the served pipeline's modules"
    )


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
    converted: Converted,
) -> list[LayerUpdate]:
    modules = sorted({k.split(".lora_")[0] for k in part})
    common_alpha = Counter(alphas.values()).most_common(1)[0][0] if alphas else None
    out: list[LayerUpdate] = []
    for module in modules:
        down, up = part.get(f"{module}.lora_A.weight"), part.get(f"{module}.lora_B.weight")
        if down is None or up is None:
            own = _of(converted, *(v for k, v in part.items() if k.startswith(module)))
            raise IncompatibleLoraError(f"{label} has an unpaired factor for {component}.{module}{own}")
        index = table.lookup(component, module)
        if index is None:
            own = _of(converted, down, up)
            raise IncompatibleLoraError(f"{label} targets {component}.{module}, which the served pipeline lacks{own}")
        shape = table.shapes[index]
        rank = down.shape[0]
        fits = up.shape[:2] == (shape[0], rank) and down.shape[1:] == shape[1:] and all(s == 1 for s in up.shape[2:])
        if not fits:
            raise IncompatibleLoraError(
                f"{label}: factors {tuple(up.shape)} x {tuple(down.shape)} do not fit "
                f"{component}.{module} of shape {tuple(shape)}{_of(converted, down, up)}"
            )
        if config:
            alpha = float(pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", rank)))  # type: ignore[arg-type]
            denominator = math.sqrt(rank) if config.get("use_rslora") else rank
        else:
            alpha = alphas.get(module, common_alpha if common_alpha is not None else rank)
            denominator = rank
        out.append(LayerFactors(index, down.reshape(rank, -1), up.reshape(up.shape[0], rank), alpha / denominator))
        if (bias := part.get(f"{module}.lora_B.bias")) is not None:
            # PEFT's `lora_bias`: its merge adds `lora_B.bias · scaling` to the Linear's bias, as this delta does.
            at = _bias_target(table, component, module, bias, label)
            out.append(LayerDelta(at, bias.reshape(-1, 1), alpha / denominator))
    return out


def _of(converted: Converted, *factors: torch.Tensor | None) -> str:
    """The file's keys a converted module's factors were made of, for an error about it (looked up only then)."""
    source = converted.origin_of(*factors)
    return f" (the file's {named(source)})" if source else ""


def _bias_target(table: TargetTable, component: str, module: str, bias: torch.Tensor, label: str) -> int:
    index = table.parameter(f"{component}.{module}.bias")
    if index is None or table.shapes[index] != tuple(bias.shape):
        raise IncompatibleLoraError(f"{label}: a bias delta {tuple(bias.shape)} fits no bias of {component}.{module}")
    return index


def target(table: TargetTable, candidates: Iterable[tuple[str, str]], label: str, stem: str | None = None) -> int:
    """The index of the first of `candidates` (component, module) the table has; refused naming them and the
    file's own name (`stem`) where it has none."""
    tried = []
    for component, module in candidates:
        index = table.lookup(component, module)
        if index is not None:
            return index
        tried.append(f"{component}.{module}")
    what = ", ".join(tried) or stem or "?"
    own = f" (the file's {stem})" if stem and tried and stem not in tried else ""
    raise IncompatibleLoraError(f"{label} targets {what}, which the served pipeline lacks{own}")


def pattern_value(patterns: Mapping | None, module: str, default: object) -> object:
    if not patterns:
        return default
    key = get_pattern_key(list(patterns), module)
    return patterns.get(key, default)
