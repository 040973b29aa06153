"""The shape of a family's identity, and `Family`, the registry: one member per family.

Pure data and string tests, no torch: the catalogue (`lora_catalog`) and the engine both read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Base", "CivitaiLabel", "Claims", "Family", "FamilyIdentity", "NameTest", "Spellings"]

# A test of one lower-cased tensor name.
NameTest = Callable[[str], bool]


class Family(StrEnum):
    """Architectures a LoRA can target; a LoRA only fits bases of its own family.

    The registry of families: each member but UNKNOWN names its identity module `families/<value>.py` (and the
    engine's `engine/families/<value>.py`); the order is the served order (the first is the default family)."""

    SDXL = "sdxl"
    SD15 = "sd15"
    SD2 = "sd2"
    FLUX = "flux"
    ZIMAGE = "zimage"
    FLUX2 = "flux2"
    QWEN_IMAGE = "qwen_image"
    FLUX_KONTEXT = "flux_kontext"
    FLUX2_DEV = "flux2_dev"
    QWEN_IMAGE_EDIT = "qwen_image_edit"
    QWEN_IMAGE_EDIT_PLUS = "qwen_image_edit_plus"
    # Image-to-video before text-to-video: where a file shows both's signs alike, the first registered wins.
    WAN_I2V = "wan_i2v"
    WAN = "wan"
    WAN22 = "wan22"
    WAN22_I2V = "wan22_i2v"
    CHROMA = "chroma"
    LTX2 = "ltx2"
    KREA2 = "krea2"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Base:
    """A base model of the family, as the UI offers it in its base filter.

    A checkpoint of the family (FLUX.1 Krea [dev] beside FLUX.1 [dev]: the same architecture and loader, other
    weights) is one more base, declared by its difference from its sibling (`Base.checkpoint`): its own request
    defaults where its card differs from the family's pipeline (`steps`, `guidance`; None: the family's), and how
    a LoRA file's metadata names it (`names`). Where its card says so (`checkpoint_of`), LoRAs made for it and
    for its sibling run on each other's pools with a note (`engine.families.origin`)."""

    repo_id: str
    display_name: str
    # The sibling whose architecture and loader it shares, whose LoRAs its card says it takes; None: none.
    checkpoint_of: str | None = None
    steps: int | None = None
    guidance: float | None = None
    # A regex searched in a LoRA file's lower-cased metadata (ModelSpec architecture, kohya's base model version
    # and checkpoint name) that names this base rather than only its family; None: nothing does.
    names: str | None = None

    def checkpoint(self, repo_id: str, display_name: str, **differences: Any) -> Base:
        """A checkpoint of this base's architecture, declared by its differences (steps, guidance, names)."""
        return dataclasses.replace(
            self, repo_id=repo_id, display_name=display_name, checkpoint_of=self.repo_id, **differences
        )


@dataclass(frozen=True)
class CivitaiLabel:
    """One of Civitai's `baseModel` labels (as its API spells it) and the base repo id standing for it.

    `finetune`: the label is an ecosystem fine-tune of the family's base (Pony), whose LoRAs run on the family's
    pool when no pool serves that fine-tune."""

    label: str
    base_model_id: str
    finetune: bool = False
    # The group holds the family's checkpoints of that base too (Civitai's one "Qwen" group: Qwen-Image and
    # Qwen-Image-2512): a file's metadata tells which where it names one (`Base.names`).
    checkpoints: bool = False


@dataclass(frozen=True)
class Spellings:
    """How a LoRA file's safetensors metadata names the family (matched lower-cased).

    `architectures`: prefixes of Stability's ModelSpec `modelspec.architecture`; `kohya_versions`: prefixes of
    kohya's `ss_base_model_version`; `kohya_v2`: kohya's `ss_v2` flag set means this family; `checkpoint_names`:
    a regex searched in the checkpoint file name trainers record (`ss_sd_model_name`), a best-effort guess."""

    architectures: tuple[str, ...] = ()
    kohya_versions: tuple[str, ...] = ()
    kohya_v2: bool = False
    checkpoint_names: str | None = None


@dataclass(frozen=True)
class Claims:
    """The family's row of the claims table: how its LoRAs show in their tensor names, in its own terms only.

    A family declares its own signs and never another family's; `families.claims` weighs every row against the
    others. `names`: a lower-cased tensor name its LoRAs have (several families may claim one: counts and widths
    decide). `own`: a name of a layer no other architecture has; it counts only for the families declaring it
    their own, whatever other rows' `names` match it. `labels`: a name the catalogue labels a file by (None: never
    by names). All None: a family its LoRAs' names never tell (an editing model on its base's transformer: only
    a declaration, a card's base or the file's metadata, names it)."""

    names: NameTest | None = None
    own: NameTest | None = None
    labels: NameTest | None = None


@dataclass(frozen=True)
class FamilyIdentity:
    """What a family is, before any pipeline: its names, bases, metadata spellings, name claims and Civitai labels."""

    family: Family
    # The family in words, as messages name it ("SD 1.5").
    label: str
    # Its known bases; the first is its reference model (the one a pool of the family loads by default).
    bases: tuple[Base, ...]
    # Lower-cased repo id prefixes of fine-tune series that publish one repo per version.
    series: tuple[str, ...] = ()
    spellings: Spellings = Spellings()
    # Its LoRAs' tensor-name signs (`Claims`).
    claims: Claims = Claims()
    # Year and month of the architecture's first release: Civitai's labels are listed oldest first, and where a
    # file shows several families' signs alike, the newest architecture's win (a newer model's LoRA may carry an
    # older one's part, as FLUX's kohya files carry CLIP-L as SDXL's `lora_te1_`; never the reverse).
    released: str = ""
    civitai: tuple[CivitaiLabel, ...] = ()
    # The embedded random-weight pipeline of the family's structure (never looked up on the Hub); None: none.
    tiny_id: str | None = None
    # The family whose pool its LoRAs run on, with a warning, when no pool of its own is served (Qwen-Image-Edit-
    # 2509/2511's on Qwen-Image-Edit's: the same transformer); None: only its own.
    falls_back_to: Family | None = None
    # Its LoRAs' full differences (ComfyUI's `.diff` / `.diff_b`, Wan's `.diff_m`: a tensor added to one parameter
    # at the LoRA's scale) apply: its engine spec names their parameters (`FamilySpec.full_differences`). False:
    # the catalogue marks such a file unsupported and the engine refuses it by name.
    full_differences: bool = False
    # Two denoisers, a high-noise and a low-noise one (Wan 2.2 A14B; the engine's `FamilySpec.second_stage` names
    # the second): only its LoRAs may come as a pair of files (`lora_catalog.pairs`), e.g. a Civitai version's.
    two_stage: bool = False
    # Deployment choices with nothing configured: `demo`, the offline demo serves a pool of its `tiny_id`;
    # `default_pool`, a GPU large enough for two pools (`serving.runtime`) serves its reference model (the first
    # registered family's alone on a smaller one). Each pool comes in the registry's order.
    demo: bool = False
    default_pool: bool = False
    # The offline demo's pools it loads in the background once its page is up (a video, a reference-editing and a
    # quantized pool): a pool of its `tiny_id` in this QUANTIZE ("off": native); None: none.
    demo_later: str | None = None

    @property
    def model_id(self) -> str:
        """The reference model's repo id."""
        return self.bases[0].repo_id

    @property
    def checkpoints(self) -> tuple[Base, ...]:
        """Its bases that are checkpoints of another of its bases (`Base.checkpoint_of`)."""
        return tuple(b for b in self.bases if b.checkpoint_of is not None)
