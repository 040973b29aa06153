"""What a LoRA recommends for its own use: a speed LoRA's sampler, steps and guidance; a card's settings.

Speed LoRAs (LCM, Lightning, Hyper-SD, DMD2, TCD, Turbo, Qwen-Image-Lightning) are recognised from well-known
repos, then from names that say so (never a bare "lightning" or "turbo"), and get their authors' settings. A
card's settings are read only from forms that parse reliably (the Hub's widget parameters, kohya's
`ss_clip_skip`, Civitai's `clipSkip`); prose is not read. Each value keeps where it came from. Sampler names are
strings here; CLIP skip is diffusers' count. The recognition order and the forms read: docs/internals.md,
"lora_catalog/hints.py".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SPEED_PRESETS",
    "LoraHints",
    "SpeedPreset",
    "blend_hints",
    "card_hints",
    "civitai_hints",
    "metadata_hints",
    "speed_hints",
]


@dataclass(frozen=True)
class SpeedPreset:
    """A speed LoRA kind's own sampler (None: the pool's own), steps and guidance."""

    sampler: str | None
    steps: int
    guidance: float


# From each method's model card or diffusers guide: LCM-LoRA (4 steps, guidance 1), SDXL-Lightning (Euler with
# trailing timesteps, guidance 0), Hyper-SD (DDIM trailing, guidance 0; its CFG files 5-8), DMD2 (LCMScheduler,
# 4 steps, guidance 0), TCD (TCDScheduler, 4 steps, guidance 0), SDXL-Turbo (ancestral Euler, trailing, 1-4 steps,
# guidance 0), lightx2v's Qwen-Image-Lightning (FlowMatchEulerDiscreteScheduler, 8 or 4 steps as its file says,
# true_cfg_scale 1: no CFG). lightx2v's Wan LoRAs are step- and CFG-distilled: "4 steps and without
# classifier-free guidance" (huggingface.co/lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill, the model its
# `Wan21_*_lightx2v_cfg_step_distill_lora_*` files are extracted from; lightx2v/Wan2.1-Distill-Loras and
# Wan2.2-Distill-Loras name theirs `..._lightx2v_4step`), and Wan2.2-Lightning's A14B pairs run "4steps" (its
# folders' names, huggingface.co/lightx2v/Wan2.2-Lightning) at guidance 1 on both stages: guidance 1 is no CFG in
# diffusers' WanPipeline (`guidance_scale > 1` turns it on). Their sampler is the pool's own flow-matching one
# (None): Wan's pipelines already run a flow scheduler with the base's shift.
SPEED_PRESETS: dict[str, SpeedPreset] = {
    "LCM": SpeedPreset("LCM", 4, 1.0),
    "Lightning": SpeedPreset("Euler trailing", 4, 0.0),
    "Hyper-SD": SpeedPreset("DDIM trailing", 8, 0.0),
    "DMD2": SpeedPreset("LCM", 4, 0.0),
    "TCD": SpeedPreset("TCD", 4, 0.0),
    "Turbo": SpeedPreset("Euler a trailing", 4, 0.0),
    "Qwen-Image-Lightning": SpeedPreset("Euler flow", 8, 1.0),
    "Wan-Lightx2v": SpeedPreset(None, 4, 1.0),
    "Wan2.2-Lightning": SpeedPreset(None, 4, 1.0),
    # Turbo's distillation extracted as a LoRA for Krea 2 Raw: Turbo's own settings (krea-ai/krea-2's README: 8
    # steps without CFG; Krea2Pipeline runs CFG at any guidance above 0), its flow-match Euler sampler. The LoRA's
    # settings, as each preset here is: they match `families.krea2.TURBO_*`, which the catalogue may not import
    # (a family's identity is imported by its own files only: tests/test_family_walls.py).
    "Krea 2 Turbo": SpeedPreset("Euler flow", 8, 0.0),
}
_WELL_KNOWN = {
    "latent-consistency/lcm-lora-sdxl": "LCM",
    "latent-consistency/lcm-lora-sdv1-5": "LCM",
    "latent-consistency/lcm-lora-ssd-1b": "LCM",
    "bytedance/sdxl-lightning": "Lightning",
    "bytedance/hyper-sd": "Hyper-SD",
    "tianweiy/dmd2": "DMD2",
    "h1t/tcd-sdxl-lora": "TCD",
    "h1t/tcd-sd15-lora": "TCD",
    "lightx2v/qwen-image-lightning": "Qwen-Image-Lightning",
    # lightx2v's for Qwen-Image-Edit-2511 (4 and 8 steps); its 2509 ones live in the repo above.
    "lightx2v/qwen-image-edit-2511-lightning": "Qwen-Image-Lightning",
    "lightx2v/wan2.1-t2v-14b-stepdistill-cfgdistill-lightx2v": "Wan-Lightx2v",
    "lightx2v/wan2.1-i2v-14b-480p-stepdistill-cfgdistill-lightx2v": "Wan-Lightx2v",
    "lightx2v/wan2.1-i2v-14b-720p-stepdistill-cfgdistill-lightx2v": "Wan-Lightx2v",
    "lightx2v/wan2.1-distill-loras": "Wan-Lightx2v",
    "lightx2v/wan2.2-distill-loras": "Wan-Lightx2v",
    "lightx2v/wan2.2-lightning": "Wan2.2-Lightning",
}
# Words, not substrings: "lcm" in "clcm" is nothing. Separators are any of "-_ ./".
_SEP = r"[-_ ./]"
# Qwen-Image-Lightning and Wan's first: their files ("Qwen-Image-Lightning-8steps-V1.0",
# "Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH") also read as SDXL-Lightning's form.
_NAMES = (
    # "Wan2.2-Lightning_T2V-A14B-4steps-lora_HIGH_fp16", "Wan22-Lightning": the name alone or with its model or
    # steps after it ("wan22_lightning_bolt_style" is a style).
    (
        "Wan2.2-Lightning",
        re.compile(
            rf"(^|{_SEP})wan{_SEP}?2{_SEP}?2{_SEP}?lightning"
            rf"($|\.safetensors$|{_SEP}(t2v|i2v|ti2v|a14b|\d{{1,2}}{_SEP}?steps?)($|{_SEP}))"
        ),
    ),
    # lightx2v's distilled Wan LoRAs by their file names: "Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32",
    # "lightx2v_I2V_14B_480p_cfg_step_distill_rank128_bf16", "wan2.1_t2v_14b_lora_rank64_lightx2v_4step",
    # "Wan_2_2_I2V_A14B_HIGH_lightx2v_4step_lora_260412_rank_64_fp16" (the word, then a distillation or steps).
    (
        "Wan-Lightx2v",
        re.compile(
            rf"(^|{_SEP})lightx2v{_SEP}(.*{_SEP})?((cfg{_SEP})?step{_SEP}?distill|\d{{1,2}}{_SEP}?steps?)($|{_SEP})"
        ),
    ),
    # Its edit releases' too: "Qwen-Image-Edit-Lightning", "Qwen-Image-Edit-2509-Lightning-4steps", "-2511-".
    (
        "Qwen-Image-Lightning",
        re.compile(rf"(^|{_SEP})qwen{_SEP}?image{_SEP}?(edit{_SEP}?((plus|\d{{4}}){_SEP}?)?)?lightning($|{_SEP})"),
    ),
    # "Krea-2-Turbo-LoRA", "krea2_turbo_8steps_lora": the model's name, then what makes it a LoRA of it (a card's
    # `base_model:adapter:krea/Krea-2-Turbo` tag is a LoRA made on Turbo, no speed LoRA).
    (
        "Krea 2 Turbo",
        re.compile(rf"(^|{_SEP})krea{_SEP}?2{_SEP}?turbo{_SEP}((\d{{1,2}}{_SEP}?steps?{_SEP})?lora|distill|speed)"),
    ),
    ("LCM", re.compile(rf"(^|{_SEP})(lcm|latent{_SEP}?consistency)($|{_SEP})")),
    ("Lightning", re.compile(rf"(^|{_SEP})(sdxl{_SEP}?lightning|lightning{_SEP}?\d+{_SEP}?steps?)($|{_SEP})")),
    ("Hyper-SD", re.compile(rf"(^|{_SEP})hyper{_SEP}?sd(xl|15)?($|{_SEP}|\d)")),
    ("DMD2", re.compile(rf"(^|{_SEP})dmd2($|{_SEP})")),
    ("TCD", re.compile(rf"(^|{_SEP})tcd($|{_SEP})")),
    ("Turbo", re.compile(rf"(^|{_SEP})(sdxl|sd|xl){_SEP}?turbo($|{_SEP})")),
)
_STEPS = re.compile(rf"(^|{_SEP})(\d{{1,2}}){_SEP}?steps?($|{_SEP})")
_CFG = re.compile(rf"(^|{_SEP})cfg($|{_SEP})")
_MAX_STEPS, _MAX_GUIDANCE, _MAX_CLIP_SKIP, _MAX_TEXT = 150, 30.0, 24, 2000


@dataclass(frozen=True)
class LoraHints:
    """A LoRA's recommended settings (None: it recommends nothing there) and where each came from."""

    speed: str | None = None
    steps: int | None = None
    guidance: float | None = None
    sampler: str | None = None
    clip_skip: int | None = None
    negative_prompt: str | None = None
    # (field, where it came from), for each field set.
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.sources

    def source(self, field: str) -> str | None:
        return dict(self.sources).get(field)

    def over(self, other: LoraHints) -> LoraHints:
        """These hints, with `other`'s filling the fields these leave unset."""
        values: dict[str, Any] = {}
        sources = dict(other.sources)
        for name in _FIELDS:
            mine = getattr(self, name)
            values[name] = mine if mine is not None else getattr(other, name)
            if mine is not None and name in dict(self.sources):
                sources[name] = dict(self.sources)[name]
        ordered = tuple((name, sources[name]) for name in _FIELDS if name in sources and values[name] is not None)
        return LoraHints(**values, sources=ordered)

    def for_a_sibling(self) -> LoraHints:
        """These hints where the LoRA runs on a sibling checkpoint of the one it was made for: without the steps
        and guidance they recommend, which are that checkpoint's (Krea 2 Raw's 28 at 4.5 are not Turbo's 8 at 0).
        A speed LoRA's are its own distillation's, and stay."""
        if self.speed is not None:
            return self
        kept = {name: getattr(self, name) for name in _FIELDS if name not in _CHECKPOINT_FIELDS}
        return LoraHints(**kept, sources=tuple(s for s in self.sources if s[0] not in _CHECKPOINT_FIELDS))

    def to_json(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in _FIELDS}, "sources": [list(s) for s in self.sources]}

    @classmethod
    def from_json(cls, data: object) -> LoraHints:
        """Read what `to_json` wrote; anything malformed is left out (a snapshot from elsewhere still loads)."""
        if not isinstance(data, Mapping):
            return cls()
        raw = data.get("sources")
        sources = dict(tuple(pair) for pair in (raw if isinstance(raw, list) else ()) if _is_pair(pair))
        return _checked(
            {name: data.get(name) for name in _FIELDS}, {n: sources.get(n, "the catalogue") for n in _FIELDS}
        )


_FIELDS = ("speed", "steps", "guidance", "sampler", "clip_skip", "negative_prompt")
# What a card recommends for the checkpoint its LoRA was made for, not for the LoRA (`LoraHints.for_a_sibling`).
_CHECKPOINT_FIELDS = ("steps", "guidance")


def speed_hints(names: Iterable[str | None], *, repo_id: str | None = None) -> LoraHints:
    """A speed LoRA's preset, when a well-known repo or one of `names` says it is one (else no hints)."""
    texts = [n.lower() for n in names if isinstance(n, str) and n]
    kind = _WELL_KNOWN.get((repo_id or "").lower())
    why = f"speed LoRA ({kind}, {repo_id})" if kind else ""
    if kind is None:
        for candidate, pattern in _NAMES:
            said = next((text for text in texts if pattern.search(text)), None)
            if said is not None:
                kind, why = candidate, f"speed LoRA ({candidate}, from its name {said!r})"
                break
    if kind is None:
        return LoraHints()
    preset = SPEED_PRESETS[kind]
    steps = next((int(m.group(2)) for text in texts if (m := _STEPS.search(text))), preset.steps)
    # Hyper-SD's "CFG" files keep guidance; their card recommends 5 to 8.
    guidance = 5.0 if kind == "Hyper-SD" and any(_CFG.search(t) for t in texts) else preset.guidance
    return _checked(
        {"speed": kind, "steps": steps, "guidance": guidance, "sampler": preset.sampler},
        dict.fromkeys(("speed", "steps", "guidance", "sampler"), why),
    )


def card_hints(card: Mapping[str, Any]) -> LoraHints:
    """A card's recommended settings, from the Hub's widget defaults (see the module docstring)."""
    found: list[LoraHints] = []
    inference = card.get("inference")
    if isinstance(inference, Mapping) and isinstance(inference.get("parameters"), Mapping):
        found.append(_from_parameters(inference["parameters"], "the card (inference parameters)"))
    widget = card.get("widget")
    for example in widget if isinstance(widget, list) else ():
        if isinstance(example, Mapping) and isinstance(example.get("parameters"), Mapping):
            found.append(_from_parameters(example["parameters"], "the card (widget example)"))
            break
    hints = LoraHints()
    for more in found:
        hints = hints.over(more)
    return hints


def metadata_hints(metadata: Mapping[str, str], names: Iterable[str] = ()) -> LoraHints:
    """What a file says of itself: a speed LoRA's title (or file `names`), the CLIP skip it was trained with."""
    speed = speed_hints([metadata.get("modelspec.title"), metadata.get("ss_output_name"), *names])
    raw = (metadata.get("ss_clip_skip") or "").strip()
    # kohya writes A1111's count ("2": one layer skipped; "None" or "1": none).
    if raw.isdigit() and int(raw) > 1:
        trained = _checked({"clip_skip": int(raw) - 1}, {"clip_skip": f"its training metadata (ss_clip_skip={raw})"})
        return speed.over(trained)
    return speed


def civitai_hints(clip_skip: int | None, names: Iterable[str | None] = ()) -> LoraHints:
    """What a Civitai version's page recommends: its `clipSkip` (A1111's count), and a speed LoRA's preset when
    its model's or version's `names` say it is one."""
    speed = speed_hints(names)
    if clip_skip is not None and clip_skip > 1:
        page = _checked({"clip_skip": clip_skip - 1}, {"clip_skip": f"its Civitai page (clipSkip {clip_skip})"})
        return speed.over(page)
    return speed


def blend_hints(hints: Iterable[LoraHints]) -> LoraHints:
    """A request's LoRAs together: a speed LoRA's settings win (a style LoRA blended with LCM takes LCM's), then
    each LoRA's in the request's order for what is left."""
    listed = list(hints)
    ordered = [h for h in listed if h.speed] + [h for h in listed if not h.speed]
    blended = LoraHints()
    for one in ordered:
        blended = blended.over(one)
    return blended


def _from_parameters(parameters: Mapping[str, Any], source: str) -> LoraHints:
    values = {
        "steps": parameters.get("num_inference_steps"),
        "guidance": parameters.get("guidance_scale"),
        "negative_prompt": parameters.get("negative_prompt"),
        "clip_skip": parameters.get("clip_skip"),
        "sampler": parameters.get("scheduler") or parameters.get("sampler"),
    }
    return _checked(values, dict.fromkeys(values, source))


def _checked(values: Mapping[str, object], sources: Mapping[str, str]) -> LoraHints:
    """The values that are of their field's type and in a sane range (cards are written by hand)."""
    kept: dict[str, Any] = {
        "steps": _whole_in(values.get("steps"), 1, _MAX_STEPS),
        "guidance": _number_in(values.get("guidance"), 0.0, _MAX_GUIDANCE),
        "clip_skip": _whole_in(values.get("clip_skip"), 1, _MAX_CLIP_SKIP),
    }
    for name in ("speed", "sampler", "negative_prompt"):
        text = values.get(name)
        if isinstance(text, str) and text.strip() and len(text) <= _MAX_TEXT:
            kept[name] = " ".join(text.split())
    if kept.get("speed") not in SPEED_PRESETS:
        kept.pop("speed", None)
    kept = {name: value for name, value in kept.items() if value is not None}
    ordered = tuple((name, sources[name]) for name in _FIELDS if name in kept)
    return LoraHints(**kept, sources=ordered)


def _number_in(value: object, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None


def _whole_in(value: object, low: int, high: int) -> int | None:
    number = _number_in(value, low, high)
    return int(number) if number is not None and number.is_integer() else None


def _is_pair(value: object) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)
