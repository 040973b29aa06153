"""A LoRA of two files: a two-stage model's (Wan 2.2 A14B's) high-noise and low-noise halves, in one Hub repo, one
Civitai version or one local folder, and how a user names one.

A file says its stage only in an explicit form: `high_noise` / `low_noise` (any case, `-` or nothing for the `_`;
Wan2.2-Lightning's `high_noise_model.safetensors`), or, in a Wan2.2-Lightning or lightx2v file's name, HIGH / LOW
as a word in capitals (Kijai's `Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16`, lightx2v's
`Wan_2_2_I2V_A14B_HIGH_lightx2v_4step_lora_...`). Anything else says no stage: a capital word alone is too often
something else (`HIGH_FASHION_style`, "Detail Slider (LOW)"), and a file that says none goes to both stages.
In a Hub repo a pair is named (`weight_name`):

- not at all, when the repo's `.safetensors` files are exactly one high-noise and one low-noise file and its card
  names a two-stage family's base, or none;
- by its folder, with a trailing '/' (`Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1/`): the two files in it;
- by its two files joined with '+' (`a_high_noise.safetensors+a_low_noise.safetensors`), for a folder of several.

A pair's files are always written the last way (high first where the names say so): its identity, and what a
recipe gives back. A Civitai version of a two-stage family's base whose `.safetensors` model files are exactly a
high and a low one is a pair.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .errors import InvalidRequestError, InvalidWeightNameError, LoraNotFoundError

__all__ = ["SEPARATOR", "choose_pair", "is_pair_name", "joined", "split_pair", "stage_in_name"]

SEPARATOR = "+"
_SUFFIX = ".safetensors"
_NOISE = tuple(re.compile(rf"(?i:{word}[_-]?noise)") for word in ("high", "low"))
_WORD = tuple(re.compile(rf"(?:^|[^A-Za-z]){word}(?:[^A-Za-z]|$)") for word in ("HIGH", "LOW"))
# The speed LoRAs whose halves say HIGH / LOW (`lora_catalog.hints` names them the same way).
_LIGHTNING = re.compile(r"(?i:(?:^|[^a-z])(?:lightning|lightx2v)(?:[^a-z]|$))")


def stage_in_name(text: str) -> int | None:
    """0 when `text` (a file name, a title) says high-noise in an explicit form, 1 when it says low-noise, None when
    it says neither (or both)."""
    text = text.removesuffix(_SUFFIX)
    patterns = (*_NOISE, *_WORD) if _LIGHTNING.search(text) else _NOISE
    said = {index % 2 for index, pattern in enumerate(patterns) if pattern.search(text)}
    return said.pop() if len(said) == 1 else None


def is_pair_name(weight_name: str) -> bool:
    """A `weight_name` naming a pair: a folder (`dir/`) or two files joined with '+'."""
    return weight_name.endswith("/") or split_pair(weight_name) is not None


def split_pair(weight_name: str) -> tuple[str, str] | None:
    """The two files of `a.safetensors+b.safetensors`, or None when it names one file or a folder."""
    first, plus, second = weight_name.partition(_SUFFIX + SEPARATOR)
    if not plus or not second:
        return None
    return first + _SUFFIX, second


def joined(first: str, second: str) -> str:
    """A pair's files as its weight name, the high-noise one first where the names say which is which."""
    if stage_in_name(_base(first)) == 1 or stage_in_name(_base(second)) == 0:
        first, second = second, first
    return f"{first}{SEPARATOR}{second}"


def choose_pair(where: str, candidates: Sequence[str], weight_name: str | None) -> tuple[str, str] | None:
    """The pair of `candidates` (a repo's `.safetensors` LoRA files) `weight_name` names, high first where the
    names say; None when it names one file (or none, and the files are not exactly one high and one low)."""
    if weight_name is None:
        stages = {stage_in_name(_base(c)) for c in candidates}
        return _ordered(*candidates) if len(candidates) == 2 and stages == {0, 1} else None
    listed = ", ".join(repr(c) for c in candidates) or "none"
    if weight_name.endswith("/"):
        inside = [c for c in candidates if c.startswith(weight_name) and "/" not in c.removeprefix(weight_name)]
        if len(inside) != 2:
            raise InvalidRequestError(
                f"folder {weight_name!r} of LoRA repo {where} holds {len(inside)} .safetensors files; accepted: a "
                f"folder of two (a high-noise and a low-noise file); its .safetensors files: {listed}"
            )
        return _ordered(*inside)
    pair = split_pair(weight_name)
    if pair is None:
        return None
    missing = [name for name in pair if name not in candidates]
    if missing:
        raise LoraNotFoundError(
            f"file {missing[0]!r} of pair {weight_name!r} was not found in LoRA repo {where}; its .safetensors "
            f"files: {listed}"
        )
    if pair[0] == pair[1]:
        raise InvalidWeightNameError(f"pair {weight_name!r} names one file twice; accepted: two files")
    return _ordered(*pair)


def _ordered(first: str, second: str) -> tuple[str, str]:
    high, _, low = joined(first, second).partition(_SUFFIX + SEPARATOR)
    return high + _SUFFIX, low


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]
