"""Is a LoRA made for the base we serve? Judged by what it declares, before its tensors are loaded.

What a LoRA declares (its card's `base_model`, its Hub tags, the kohya/ModelSpec
metadata in its file) decides first; a LoRA that declares nothing is judged by
its tensors alone, which must then fit the served modules by name and shape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from engine.errors import IncompatibleLoraError
from lora_catalog.bases import family_from_keys, family_from_metadata, family_of_base
from lora_catalog.entries import Family

__all__ = ["check_family", "declared_bases_from_tags"]

logger = logging.getLogger(__name__)


def declared_bases_from_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """Bases named by Hub tags such as `base_model:adapter:<base>`."""
    bases = []
    for tag in tags:
        if tag.startswith("base_model:adapter:"):
            bases.append(tag.removeprefix("base_model:adapter:"))
        elif tag.startswith("base_model:") and tag.count(":") == 1:
            bases.append(tag.removeprefix("base_model:"))
    return tuple(dict.fromkeys(bases))


def check_family(
    label: str,
    *,
    served_base: str,
    declared_bases: Iterable[str],
    metadata: Mapping[str, str] | None = None,
    tensor_names: Iterable[str] = (),
) -> str | None:
    """Raise `IncompatibleLoraError` for a LoRA of another family; return a warning when it declares none."""
    served = family_of_base(served_base)
    bases = tuple(dict.fromkeys(declared_bases))
    families = {family_of_base(b) for b in bases} - {Family.UNKNOWN}
    if families:
        if served in families:
            return None
        raise IncompatibleLoraError(
            f"{label} was made for {', '.join(bases)} ({', '.join(sorted(families))}); "
            f"this Space serves {served_base} ({served}); accepted: LoRAs for the {served} family"
        )
    declared = family_from_metadata(metadata or {}) if metadata is not None else None
    from_file = declared
    if from_file is None and tensor_names:
        from_file = family_from_keys(tensor_names)
    # Tensor names cannot tell SD 1.x from SD 2.x (`family_from_keys` says SD 1.5 for both).
    guessed_sd = declared is None and from_file is Family.SD15 and served is Family.SD2
    if from_file is not None and from_file not in (served, Family.UNKNOWN) and not guessed_sd:
        named = f" (its card names {', '.join(bases)})" if bases else ""
        raise IncompatibleLoraError(
            f"{label} was trained for the {from_file} family{named}; this Space serves {served_base} ({served}); "
            f"accepted: LoRAs for the {served} family"
        )
    # Tensor names can rule a family out but only guess at one, so a guess that fits still earns the warning.
    if declared == served:
        return None
    if metadata is None:
        return None
    warning = f"{label} declares no base model we know; it is judged by its tensors alone"
    logger.warning("%s", warning)
    return warning
