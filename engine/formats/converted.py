"""What each tensor of a LoRA file became in its family's converter: so that none is lost without a word.

diffusers' converters (the served family's `FamilySpec.convert_lora`) pop what they read and leave what they do
not know: some raise on a leftover key, others drop it (with a log line at most), and the file then runs with part of
its LoRA missing. The conversion is therefore run under a torch function mode that carries, on every tensor it
makes, the names of the file's tensors its values came from (a product, a slice, a concatenation, a split of a
fused layer); nothing is copied for it and the converter runs as it would. Then each converted tensor names the
file's tensors it was made of (so that an error names the file's keys, not a converter's spelling of them), and
each of the file's tensors is accounted for: it reached a converted tensor, or it is an `.alpha` that the converter
read (folded into the factors' scale, or into the network alphas it returns), or it is all zeros (it would change
nothing). Any other is dropped; the caller
refuses the file naming it (engine.formats.adapters).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Converted", "convert_traced", "named"]

_SOURCES = "_lora_sources"  # the attribute the mode sets on the tensors it sees (removed after)
_ALPHA = ".alpha"


@dataclass(frozen=True)
class Converted:
    """A file's factors in diffusers' names (`state_dict`), the network alphas the converter read, each converted
    name's origin (the file's tensor names), and the file's tensors that reached none and were not read as alphas."""

    state_dict: dict[str, torch.Tensor]
    network_alphas: Mapping[str, Any] | None
    origins: Mapping[str, tuple[str, ...]]
    dropped: tuple[str, ...]

    def origin(self, converted_names: Sequence[str]) -> tuple[str, ...]:
        """The file's tensor names that the given converted names were made of (sorted, each once)."""
        return tuple(sorted({name for key in converted_names for name in self.origins.get(key, ())}))

    def origin_of(self, *tensors: torch.Tensor | None) -> tuple[str, ...]:
        """The file's tensor names the given converted tensors were made of (found by identity: a later renaming
        of the converted names, diffusers' PEFT names for a text encoder, keeps the tensors)."""
        wanted = {id(t) for t in tensors if t is not None}
        keys = [key for key, value in self.state_dict.items() if id(value) in wanted]
        return self.origin(keys)


class _Provenance(TorchFunctionMode):
    """Carries the file's tensor names through every torch function: an output's are the union of its inputs';
    an in-place write (`x[rows] = y`, `x.mul_(y)`) adds the written tensor's to its target. Every input's names
    are recorded as read (an `.alpha` turned into a float by `.item()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()
        # Every tensor given names, so that they can be taken off after; weakly, so that the converter's
        # intermediates are freed when it drops them, as without the mode.
        self.seen: list[weakref.ref[torch.Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        found = [getattr(t, _SOURCES, None) for t in _tensors((*args, *kwargs.values()))]
        sources: frozenset[str] = frozenset().union(*(f for f in found if f))
        out = func(*args, **kwargs)
        if not sources:
            return out
        self.read |= sources
        name = getattr(func, "__name__", "")
        written = [args[0]] if args and (name == "__setitem__" or name.endswith("_")) else []
        written += [kwargs["out"]] if isinstance(kwargs.get("out"), torch.Tensor) else []
        for tensor in [*_tensors((out,)), *written]:
            self._mark(tensor, sources)
        return out

    def _mark(self, tensor: torch.Tensor, sources: frozenset[str]) -> None:
        had = getattr(tensor, _SOURCES, None)
        if had is None:
            self.seen.append(weakref.ref(tensor))
        setattr(tensor, _SOURCES, sources if had is None else had | sources)


def _tensors(values: tuple) -> list[torch.Tensor]:
    """The tensors among `values`, and in the lists and tuples among them (`torch.cat`'s input, `chunk`'s output):
    cheaper than a pytree walk on every one of a conversion's operations."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def convert_traced(
    convert: Callable[[dict[str, torch.Tensor]], tuple[dict[str, torch.Tensor], Mapping[str, Any] | None]],
    tensors: Mapping[str, torch.Tensor],
) -> Converted:
    """`convert` (the served family's converter, bound to its denoiser) run on `tensors`, with what each became."""
    mode = _Provenance()
    for name, tensor in tensors.items():
        setattr(tensor, _SOURCES, frozenset((name,)))
        mode.seen.append(weakref.ref(tensor))
    try:
        with mode:
            state_dict, network_alphas = convert(dict(tensors))
        origins = {
            key: tuple(sorted(getattr(value, _SOURCES, ())))
            for key, value in state_dict.items()
            if isinstance(value, torch.Tensor)
        }
    finally:
        for ref in mode.seen:
            if (alive := ref()) is not None and hasattr(alive, _SOURCES):
                delattr(alive, _SOURCES)
    landed = {name for names in origins.values() for name in names}
    # A tensor of zeros changes nothing wherever it would land: diffusers' FLUX.1 converter purges such T5,
    # `diff_b` and position-embedding parts ("ineffective"), and trainers save them so; the file runs whole.
    dropped = tuple(
        sorted(
            name
            for name in tensors
            if name not in landed
            and not (name.endswith(_ALPHA) and name in mode.read)
            and bool(torch.count_nonzero(tensors[name]))
        )
    )
    return Converted(state_dict, network_alphas, origins, dropped)


def named(names: Sequence[str], shown: int = 4) -> str:
    """A few names (the first `shown`, in the order given) and the count of the rest: `a, b, c, d and 12 more`."""
    found = list(names)
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return ", ".join(found[:shown]) + more
