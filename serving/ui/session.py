"""The browser session's side of a generation: the LoRA's recommended settings in the form, the history of
results with "use these settings again", and share links.

A share link is the Space's URL with the form's values as query parameters (`?prompt=...&lora=owner/name&
lora_scale=0.8&sampler=LCM&steps=4&seed=42...`), read when the page loads; the history keeps each result's
values the same way, so both fill the form through `form_values`. Values are checked as the form's own (a size or
sampler the pool does not offer, a number out of range, is left as the form has it): a link is only a form
filled in, and the engine checks the request when it is sent. A link cannot carry an input image: for a result
made from one it has `input=image-to-image` (or `inpainting`) and the strength, and the form says so; made from
several (further reference images), `references=` each one's short SHA-256 in order (as the recipe's "Reference
hashes"), which the form's note lists; made with an IC-LoRA's reference video, `reference_video=` its file's
SHA-256 (as the recipe's "Reference video"), which the note names, and the settings it ran with
(`reference_strength`, `reference_downscale`, as the recipe names them with it), which fill the boxes under the
reference video's slot, so the same file uploaded again makes the same clip. Pure functions, no Gradio objects but
`gr.skip`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import gradio as gr

from engine.requests import FPS_RANGE, MAX_IMAGES, MAX_SEED, REQUEST_FIELDS, ModelDefaults
from engine.samplers import find_sampler, sampler_label
from lora_catalog.hints import LoraHints, blend_hints
from serving.ui.inputs import STARTED, link_note, strength_control, video_note

__all__ = [
    "FIELDS",
    "HISTORY_SIZE",
    "LINK_NAMES",
    "WINDOWS",
    "absent_values",
    "form_values",
    "history_entry",
    "recommended",
    "reference_values",
    "share_params",
    "share_url",
    "video_values",
    "window",
]

# The form's fields a link or a history entry carries, in the order `form_values` answers them.
FIELDS = (
    "prompt",
    "negative",
    "lora",
    "lora_scale",
    "lora_revision",
    "lora_weight",
    "lora_2",
    "lora_2_scale",
    "lora_2_revision",
    "lora_2_weight",
    "size",
    "steps",
    "guidance",
    "sampler",
    "clip_skip",
    "images",
    "seed",
    "strength",
    "input",
    "base",
    # A video result's frames and rate (absent for an image): "use these settings again" makes the same clip.
    "num_frames",
    "fps",
    # A two-stage pool's low-noise scales (Wan 2.2 A14B: each LoRA's `scale_2`; absent elsewhere).
    "lora_scale_2",
    "lora_2_scale_2",
    # Each LoRA's "active from … to …" range, fractions of the steps (`LoraSpec.start`/`end`; absent: every step).
    "lora_start",
    "lora_end",
    "lora_2_start",
    "lora_2_end",
    # An IC-LoRA run's in-context settings (`GenerateRequest.reference_strength`, `reference_downscale`; absent:
    # diffusers' defaults), which the same file needs to make the same clip again.
    "reference_strength",
    "reference_downscale",
)
# A link's name for a Gradio API argument of the request's declared fields (`engine.request_fields`) where the
# form's differs (`images` there are the reference images; here the number of images); the rest are their own.
# Kept as the first links named them, so that old links open.
LINK_NAMES = {
    "negative_prompt": "negative",
    "width": "size",
    "height": "size",
    "scheduler": "sampler",
    "num_images": "images",
    "images": "references",
    "video": "reference_video",
}
# What a link carries besides the form's fields, for the note: the images' short SHA-256s (image 1 first), a
# reference video's SHA-256.
NOTED = ("references", "reference_video")
HISTORY_SIZE = 12
_DIGEST = re.compile(r"[0-9a-f]{12}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MOST_REFERENCES = 16
_THUMB = 192
# The LoRA scales a link leaves out at 1 (the form's default); `reference_downscale` 1 is a value the run set.
_UNIT_SCALES = ("lora_scale", "lora_2_scale")
_IN_CONTEXT = ("reference_strength", "reference_downscale")
# The in-context settings' ranges, as the request declares them (`engine.requests`).
_RANGES = {f.name: (float(f.low or 0), float(f.high or 0)) for f in REQUEST_FIELDS}
# Each LoRA's scale and its low-noise scale, and each LoRA's range (`LoraSpec.start`/`end`).
_LOW_SCALES = (("lora_scale", "lora_scale_2"), ("lora_2_scale", "lora_2_scale_2"))
WINDOWS = ("lora_start", "lora_end", "lora_2_start", "lora_2_end")
# The parameters a field is read from where they are not its own name: the form's note says what a link
# cannot carry (an input image, reference images, a reference video).
_READ_FROM = {"input": ("input", "references", "reference_video")}
_TEXT = ("prompt", "negative", "lora", "lora_revision", "lora_weight", "lora_2", "lora_2_revision", "lora_2_weight")


def share_params(values: Mapping[str, object]) -> dict[str, str]:
    """The form's values as query parameters (empty ones and defaults left out: a short link)."""
    params: dict[str, str] = {}
    for name in (*FIELDS, *NOTED):
        value = values.get(name)
        if value is None or value == "" or (name in _UNIT_SCALES and value == 1.0):
            continue
        params[name] = f"{value:g}" if isinstance(value, float) else str(value)
    return params


def share_url(base_url: str, params: Mapping[str, str]) -> str:
    return f"{base_url.rstrip('/')}/?{urlencode(params)}"


def form_values(params: Mapping[str, str], defaults: ModelDefaults, max_steps: int) -> tuple[Any, ...]:
    """The form's new values from a link's or a history entry's parameters, in FIELDS' order, then whether the
    seed is random. Every field is set: one the link leaves out (a link is short: `share_params` skips defaults)
    is put back at its default (`absent_values`), not left at what an earlier run put there; `gr.skip()` only
    where a parameter is there but not one the form can show, or the field does not apply to the pool."""
    out: dict[str, Any] = {}
    for name in _TEXT:
        if isinstance(params.get(name), str):
            out[name] = params[name]
    for name in ("lora_scale", "lora_2_scale", "lora_scale_2", "lora_2_scale_2"):
        out[name] = _number(params.get(name), -2.0, 2.0)
    sizes = [f"{w}x{h}" for w, h in defaults.sizes]
    out["size"] = params["size"] if params.get("size") in sizes else None
    out["steps"] = _whole(params.get("steps"), 1, max_steps)
    out["guidance"] = _number(params.get("guidance"), 0.0, 20.0)
    sampler = find_sampler(params.get("sampler", ""))
    out["sampler"] = sampler.label if sampler is not None and sampler.label in defaults.samplers else None
    out["clip_skip"] = _whole(params.get("clip_skip"), 1, defaults.max_clip_skip + 1)
    out["images"] = _whole(params.get("images"), 1, MAX_IMAGES)
    out["seed"] = _whole(params.get("seed"), 0, MAX_SEED)
    out["strength"] = _number(params.get("strength"), 0.0, 1.0)
    # The result started from an input image (or several), which the link cannot carry: the form says so.
    if params.get("input") in STARTED:
        out["input"] = link_note(params["input"], _digests(params.get("references")))
    # Nor an IC-LoRA's reference video: which file it was.
    video = params.get("reference_video")
    if isinstance(video, str) and _SHA256.fullmatch(video) is not None:
        out["input"] = video_note(video)
    out["base"] = params.get("base") or None
    out["num_frames"], out["fps"] = video_values(params, defaults)
    out["reference_strength"], out["reference_downscale"] = reference_values(params, defaults)
    for name in WINDOWS:
        out[name] = _number(params.get(name), 0.0, 1.0)
    absent = absent_values(defaults, out)
    values = tuple(
        out[name] if out.get(name) is not None else gr.skip() if _given(name, params) else absent[name]
        for name in FIELDS
    )
    # A link with a seed reproduces that image: the seed is not drawn again; one without is drawn.
    randomize = gr.skip() if out["seed"] is None else False
    return (*values, randomize if "seed" in params else True)


def absent_values(defaults: ModelDefaults, read: Mapping[str, Any]) -> dict[str, Any]:
    """Each field as the form shows it when a link leaves it out: the value that sends the request's declared
    default (`engine.request_fields`: no LoRA, the pool's steps, guidance, size and strength, its sampler, no
    CLIP skip, one image, each LoRA on every step, an in-context setting empty for diffusers' own), as the form
    starts on `defaults`' pool; a low-noise scale follows its LoRA's scale as `read` (1 when that is left out too).
    `gr.skip()` for what the pool's form does not show (a video's frames on an image pool) and for the base,
    which the filter always names (a link without one opens on the browsed base)."""
    skip = gr.skip()
    video, in_context = bool(defaults.video and defaults.num_frames and defaults.fps), defaults.reference_video
    scales = {low: read.get(scale) if read.get(scale) is not None else 1.0 for scale, low in _LOW_SCALES}
    return {
        **dict.fromkeys(_TEXT, ""),
        **dict.fromkeys(_UNIT_SCALES, 1.0),
        **scales,
        "size": f"{defaults.sizes[0][0]}x{defaults.sizes[0][1]}",
        "steps": defaults.steps,
        "guidance": defaults.guidance,
        "sampler": "",
        "clip_skip": 1,
        "images": 1,
        "seed": skip,
        "strength": strength_control(defaults)["value"],
        "input": "",
        "base": skip,
        "num_frames": defaults.num_frames if video else skip,
        "fps": defaults.fps if video else skip,
        **{name: 1.0 if name.endswith("_end") else 0.0 for name in WINDOWS},
        **dict.fromkeys(_IN_CONTEXT, None if in_context else skip),
    }


def video_values(params: Mapping[str, str], defaults: ModelDefaults) -> tuple[int | None, int | None]:
    """A link's frames and rate as the video pool's form takes them (frames of its k+1 rule up to its most, a rate
    in FPS_RANGE), else None; both None on an image pool."""
    if not defaults.video:
        return None, None
    step = defaults.frame_multiple or 4
    frames = _whole(params.get("num_frames"), step + 1, defaults.max_frames or defaults.num_frames or step + 1)
    return (frames if frames is None or (frames - 1) % step == 0 else None), _whole(params.get("fps"), *FPS_RANGE)


def reference_values(params: Mapping[str, str], defaults: ModelDefaults) -> tuple[float | None, int | None]:
    """A link's in-context settings as an in-context pool's form takes them (inside the request's declared
    ranges: the engine checks the rest when the request is sent), else None; both None on a pool without a
    reference video's slot."""
    if not defaults.reference_video:
        return None, None
    strength, downscale = _IN_CONTEXT
    low, high = _RANGES[downscale]
    return _number(params.get(strength), *_RANGES[strength]), _whole(params.get(downscale), int(low), int(high))


def _given(name: str, params: Mapping[str, str]) -> bool:
    """Whether the link gives `name` (one it gives but the form cannot show is left as the form has it)."""
    return any(given in params for given in _READ_FROM.get(name, (name,)))


def window(form: Mapping[str, Any], ref: str) -> tuple[float | None, float | None]:
    """The form's range for LoRA `ref` ("lora", "lora_2") as the request's `start` and `end`: None where it
    is every step's (0, 1, or empty), so that a LoRA on every step is the request it was before ranges."""
    start, end = form.get(f"{ref}_start"), form.get(f"{ref}_end")
    return (None if start in (None, 0) else start), (None if end in (None, 1) else end)


def low_noise_moved(params: Mapping[str, str]) -> tuple[bool, bool]:
    """Whether a link's or a history entry's low-noise scales were moved off their LoRA's scale (1 where the link
    leaves it out): such a one stays as the link sets it; the others follow their LoRA's scale (`serving.ui.
    video_ui.follow_scale`)."""
    moved = []
    for scale, low in (("lora_scale", "lora_scale_2"), ("lora_2_scale", "lora_2_scale_2")):
        value = _number(params.get(low), -2.0, 2.0)
        moved.append(value is not None and value != (_number(params.get(scale), -2.0, 2.0) or 1.0))
    return moved[0], moved[1]


def history_entry(params: Mapping[str, str], image: Any, caption: str) -> dict[str, Any]:
    """A result as the session's history keeps it: its form values, a thumbnail and a caption."""
    thumb = image.copy()
    thumb.thumbnail((_THUMB, _THUMB))
    return {"params": dict(params), "thumb": thumb, "caption": caption}


def recommended(
    hints: Sequence[LoraHints], defaults: ModelDefaults, max_steps: int, on: bool
) -> tuple[int, float, str, int, str]:
    """Steps, guidance, sampler, CLIP skip (A1111's count) and a note saying where each came from: the LoRAs'
    recommendations (a speed LoRA's first) when `on` and they give one the pool can follow, else the pool's."""
    blended = blend_hints(hints) if on else LoraHints()
    where = dict(blended.sources)
    notes: list[tuple[str, str]] = []
    steps = defaults.steps
    if blended.steps is not None and blended.steps <= max_steps:
        steps = blended.steps
        notes.append((f"steps {steps}", where["steps"]))
    guidance = defaults.guidance
    # A model that takes no guidance (FLUX.1 [schnell]) keeps its own.
    if blended.guidance is not None and defaults.guidance_kind != "none":
        guidance = blended.guidance
        notes.append((f"guidance {guidance:g}", where["guidance"]))
    sampler = ""
    if blended.sampler:
        found = find_sampler(blended.sampler)
        label = found.label if found is not None else sampler_label(blended.sampler, ())
        if label in defaults.samplers:
            sampler = label
            notes.append((f"sampler {label}", where["sampler"]))
    clip_skip = 1
    if blended.clip_skip is not None and blended.clip_skip <= defaults.max_clip_skip:
        clip_skip = blended.clip_skip + 1
        notes.append((f"CLIP skip {clip_skip}", where["clip_skip"]))
    if notes:
        kind = f"**{blended.speed} speed LoRA**: its own settings. " if blended.speed else ""
        # One line per source: "steps 4, guidance 1, sampler LCM — speed LoRA (LCM, ...)".
        sources = dict.fromkeys(source for _, source in notes)
        lines = [", ".join(v for v, s in notes if s == source) + f" — {source}" for source in sources]
        note = f"{kind}Recommended by the LoRA: " + "; ".join(lines)
    elif not on and hints and any(not h.empty for h in hints):
        note = "The LoRA's recommended settings are off: the model's defaults."
    else:
        note = ""
    return steps, guidance, sampler, clip_skip, note


def _digests(text: object) -> tuple[str, ...]:
    """A link's `references`: short SHA-256s, comma-separated; none where any is not one (a link is only text)."""
    found = tuple(text.split(",")) if isinstance(text, str) and text else ()
    good = len(found) <= _MOST_REFERENCES and all(_DIGEST.fullmatch(digest) for digest in found)
    return found if good else ()


def _number(text: object, low: float, high: float) -> float | None:
    try:
        value = float(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and low <= value <= high else None


def _whole(text: object, low: int, high: int) -> int | None:
    value = _number(text, low, high)
    return int(value) if value is not None and value.is_integer() else None
