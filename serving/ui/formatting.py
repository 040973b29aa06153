"""What the UI shows, as text: LoRA cards, result timings, engine status, API snippets; and input parsing.

Pure functions, no Gradio: `app.py` wires them to components, tests call them directly.
"""

from __future__ import annotations

import html
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageDraw

from engine.errors import InvalidRequestError
from engine.requests import GenerateResult, LoraSpec, ModelDefaults
from engine.schedules import schedule_fields, strength_text
from lora_catalog.entries import LoraEntry
from lora_catalog.listing import CatalogPage

if TYPE_CHECKING:
    from engine.pools.engine import LoraCheck
    from engine.pools.scheduler import QueueView

__all__ = [
    "APP_CSS",
    "catalog_json",
    "check_info",
    "clip_skip_range",
    "entry_card",
    "error_card",
    "insert_trigger",
    "lora_spec",
    "note_html",
    "parse_size",
    "placeholder_image",
    "preview_html",
    "queue_text",
    "readiness_html",
    "recommended_text",
    "result_html",
    "result_info",
    "sampler_choices",
    "seconds",
    "seed_value",
    "size_presets",
]

_MIB = 2**20

APP_CSS = """
.banner { border: 2px solid #f59e0b; background: #fffbeb; color: #78350f; border-radius: 12px; padding: 10px 16px; }
.banner p { margin: 0; color: #78350f; }
.hero h1 { margin-bottom: 0; }
.hero p { margin-top: 2px; opacity: .8; }
.lora-card { border: 1px solid var(--border-color-primary); border-radius: 12px; padding: 12px 14px; }
.lora-card h3 { margin: 0 0 2px 0; }
.lora-card p { margin: 6px 0; }
.lora-card .ref { font-family: var(--font-mono); font-size: .85em; opacity: .7; }
.badge { display: inline-block; border-radius: 999px; padding: 1px 9px; font-size: .8em; font-weight: 600;
         margin-right: 4px; background: var(--neutral-100); color: var(--neutral-700); }
.badge.nc { background: #fee2e2; color: #991b1b; }
.badge.ok { background: #dcfce7; color: #166534; }
.chip { display: inline-block; font-family: var(--font-mono); background: var(--primary-100);
        color: var(--primary-800); border-radius: 6px; padding: 0 6px; margin: 2px 4px 2px 0; }
.lora-error { border: 1px solid #fca5a5; background: #fef2f2; color: #991b1b; border-radius: 12px;
              padding: 10px 14px; }
#result-info table.timing, #compare-info table.timing { width: 100%; border-collapse: collapse; border: none;
                                                        margin: 4px 0; }
#result-info table.timing tr, #result-info table.timing td, #compare-info table.timing tr,
#compare-info table.timing td { border: none !important; background: none !important; }
#result-info table.timing td, #compare-info table.timing td { padding: 2px 10px 2px 0; white-space: nowrap; }
#compare-cells .grid-wrap { min-height: 0 !important; }
#result-info .bar { height: 8px; border-radius: 4px; background: var(--primary-500); min-width: 2px; }
#result-info ul { margin: 4px 0; }
.nav-row { align-items: center; }
#lora-gallery .grid-wrap { min-height: 0 !important; max-height: 72vh; }
.tiny-output img { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }
"""


def size_presets(defaults: ModelDefaults) -> list[tuple[str, str]]:
    """(label, "WxH") choices: the served model's presets (its family's, scaled to its side; small ones for a
    tiny model), carried in its defaults so a remote pool's are shown as a local one's."""
    return [(f"{w} × {h}", f"{w}x{h}") for w, h in defaults.sizes]


def sampler_choices(defaults: ModelDefaults) -> list[tuple[str, str]]:
    """The sampler menu: first the default (the LoRA's recommendation, else the model's own, named), then the
    names people know that the pool offers. The default's label is short: the menu's box shows about 25
    characters at the default width before its arrow."""
    own = f" ({defaults.sampler})" if defaults.sampler else ""
    return [(f"Default{own}", ""), *((label, label) for label in defaults.samplers)]


def clip_skip_range(defaults: ModelDefaults) -> dict[str, Any]:
    """The CLIP skip slider's range in A1111's count (1: none), and whether the model takes one at all."""
    top = defaults.max_clip_skip + 1
    return {
        "minimum": 1,
        "maximum": max(top, 2),
        "interactive": defaults.max_clip_skip > 0,
        "info": "1 = none (A1111's count)" if top > 1 else "this model takes none",
    }


# How a served model reads `guidance` (engine.requests.GuidanceKind): the slider's label and info.
_GUIDANCE = {
    "cfg": ("Guidance", "classifier-free guidance; the negative prompt applies"),
    "distilled": ("Guidance (distilled)", "the model's distilled guidance embedding: no CFG, no negative prompt"),
    "none": ("Guidance (not used)", "this model takes no guidance"),
}


def guidance_control(defaults: ModelDefaults) -> dict[str, Any]:
    """The guidance slider for a served model: its default, and a label and info saying how the model reads it."""
    label, info = _GUIDANCE[defaults.guidance_kind]
    return {"value": defaults.guidance, "label": label, "info": info, "interactive": defaults.guidance_kind != "none"}


def negative_control(defaults: ModelDefaults) -> dict[str, Any]:
    """The negative prompt box for a served model: editable where the model reads it, else saying it does not."""
    applies = defaults.negative_prompt
    return {"interactive": applies, "info": "" if applies else "not used by this model (no CFG)"}


def inputs_note(defaults: ModelDefaults) -> str:
    """Which of guidance and the negative prompt a served model reads, in a few words."""
    if defaults.guidance_kind == "distilled":
        return f"distilled guidance {defaults.guidance:g} (no negative prompt)"
    if defaults.guidance_kind == "none":
        return "no guidance or negative prompt"
    return f"guidance {defaults.guidance:g}"


def parse_size(value: str | None) -> tuple[int, int]:
    width, _, height = (value or "").partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise InvalidRequestError(f"size {value!r} is not accepted; accepted: WIDTHxHEIGHT, e.g. 1024x1024")
    return int(width), int(height)


def placeholder_image(side: int = 256) -> Image.Image:
    """A neutral tile for LoRAs without a preview: soft grey with a small picture glyph."""
    image = Image.new("RGB", (side, side), (229, 231, 235))
    draw = ImageDraw.Draw(image)
    u = side / 8
    line, fill = (156, 163, 175), (191, 196, 204)
    draw.rounded_rectangle((2.4 * u, 2.7 * u, 5.6 * u, 5.3 * u), radius=u / 3, outline=line, width=max(2, side // 90))
    draw.polygon([(2.8 * u, 4.95 * u), (3.7 * u, 3.8 * u), (4.3 * u, 4.5 * u), (4.7 * u, 4.1 * u), (5.2 * u, 4.95 * u)],
                 fill=fill)  # fmt: skip
    draw.ellipse((4.55 * u, 3.0 * u, 5.0 * u, 3.45 * u), fill=fill)
    return image


def insert_trigger(prompt: str | None, old: str | None, new: str | None) -> str:
    """Put `new` at the front of the prompt (once), taking out `old` if it still leads the prompt."""
    text = (prompt or "").strip()
    if old and text.lower().startswith(old.lower()):
        text = text[len(old) :].lstrip(" ,")
    if not new or new.lower() in text.lower():
        return text
    return f"{new}, {text}" if text else new


def lora_spec(
    ref: str | None, scale: float | None, revision: str | None = None, weight: str | None = None
) -> LoraSpec | None:
    """A LoraSpec from form fields (an empty scale is 1), or None when the LoRA field is empty."""
    ref = (ref or "").strip()
    if not ref:
        return None
    return LoraSpec(
        ref,
        scale=1.0 if scale is None else scale,
        revision=(revision or "").strip() or None,
        weight_name=(weight or "").strip() or None,
    )


def seed_value(seed: float | None, randomize: bool = False) -> float | None:
    """None (a random seed) for randomize, an empty field or a negative number; otherwise the value as given.

    The engine checks what is left (an integer, not a bool or 1.5), so its message names the bad value.
    """
    if randomize or seed is None:
        return None
    if isinstance(seed, int | float) and not isinstance(seed, bool) and seed < 0:
        return None
    return seed


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


# A video LoRA's card preview: muted (so browsers autoplay it), looping, fetched only once it is shown.
_VIDEO = (
    '<video class="lora-video" src="{url}" muted loop autoplay playsinline controls preload="metadata" '
    'style="width:100%;max-height:240px;border-radius:8px"></video>'
)


def entry_card(entry: LoraEntry, hub_url: str, check: LoraCheck | None = None) -> str:
    """The selected LoRA: title, where it lives, licence (with a non-commercial badge), trigger words, and a video
    LoRA's preview video."""
    if entry.repo_id:
        link = f"{hub_url.rstrip('/')}/{entry.repo_id}"
        where = f'<a href="{_esc(link)}" target="_blank" rel="noopener">{_esc(link)}</a>'
    elif entry.page_url:
        where = f'<a href="{_esc(entry.page_url)}" target="_blank" rel="noopener">{_esc(entry.page_url)}</a>'
    else:
        where = f"local file <code>{_esc(entry.weight_name or entry.ref)}</code>"
    badges = [f'<span class="badge">{_esc(entry.license or "licence unknown")}</span>']
    if entry.non_commercial:
        badges.append('<span class="badge nc">non-commercial</span>')
    if entry.unsupported:
        badges.append(f'<span class="badge nc">not supported: {_esc(entry.unsupported)}</span>')
    if entry.source == "civitai":
        labels = [t.removeprefix("civitai-base:") for t in entry.tags if t.startswith("civitai-base:")]
        badges.append(f'<span class="badge">Civitai{_esc(" · " + labels[0]) if labels else ""}</span>')
    if entry.source in ("hub", "civitai"):
        badges.append(f'<span class="badge">⬇ {entry.downloads:,}</span><span class="badge">♥ {entry.likes:,}</span>')
    triggers = "".join(f'<span class="chip">{_esc(t)}</span>' for t in entry.trigger_words) or "<em>none given</em>"
    parts = [
        f"<h3>{_esc(entry.title)}</h3>",
        f'<div class="ref">{_esc(entry.ref)}</div>',
        f"<p>{where}</p>",
        f"<p>{''.join(badges)}</p>",
        f"<p>Trigger words: {triggers}</p>",
    ]
    if entry.preview_videos:
        # The gallery's tile is a still (its first preview image, or the placeholder): the card plays the video.
        parts.append(_VIDEO.format(url=_esc(entry.preview_videos[0])))
    if recommended := recommended_text(entry):
        parts.append(f"<p>Recommended: {_esc(recommended)}</p>")
    if check is not None:
        parts.append(
            f'<p><span class="badge ok">✓ loads</span> rank {check.rank} · {check.layers} layers · '
            f"{check.file_size / _MIB:.1f} MiB · {_esc(', '.join(check.components))} · cache {_esc(check.cache)}</p>"
        )
        parts += [f"<p>⚠ {_esc(w)}</p>" for w in check.warnings]
    return f'<div class="lora-card">{"".join(parts)}</div>'


def recommended_text(entry: LoraEntry) -> str:
    """What the LoRA's page recommends (Civitai's strength range; a CLIP skip its card, page or file states, in
    A1111's count as the form shows it), or "" when it says nothing."""
    values = dict(entry.recommended)
    parts = []
    if "strength" in values:
        span = (
            f" ({values['min_strength']:g}–{values['max_strength']:g})"
            if "min_strength" in values and "max_strength" in values
            else ""
        )
        parts.append(f"scale {values['strength']:g}{span}")
    if entry.hints.clip_skip:
        parts.append(f"CLIP skip {entry.hints.clip_skip + 1}")
    return " · ".join(parts)


def queue_text(view: QueueView) -> str:
    """A queued request's place, as the progress bar shows it (the same numbers every transport sees)."""
    doing = "preparing its LoRAs" if view.state == "preparing" else "ready, waiting for the GPU"
    # The device time until it is done: those ahead, its own run, other pools' runs it shares the GPU with.
    done = f"; done in about {view.device_s:.0f} s" if view.device_s > 0 else ""
    return f"In queue: {view.position} of {view.waiting} ({doing}{done})"


def readiness_html(ref: str, state: str, detail: str = "") -> str:
    """The card's badge for a selected LoRA: being prepared, ready (in the cache), or why it cannot be."""
    label = {"preparing": "⏳ preparing…", "ready": "✓ ready", "failed": "✗ cannot be prepared"}[state]
    more = f" — {_esc(detail)}" if detail else ""
    return f"<div class='lora-ready {state}' data-state='{state}'>{_esc(ref)}: {label}{more}</div>"


def check_info(check: LoraCheck) -> dict[str, Any]:
    """A LoraCheck as JSON-ready data."""
    data = asdict(check)
    return {**data, "components": list(check.components), "warnings": list(check.warnings)}


def note_html(message: str) -> str:
    """A note under the LoRA's card: something to know, not a refusal."""
    return f'<p class="lora-note">⚠ {_esc(message)}</p>'


def error_card(message: str) -> str:
    return f'<div class="lora-error"><b>This LoRA cannot be used.</b><br>{_esc(message)}</div>'


def result_info(result: GenerateResult) -> dict[str, Any]:
    """The API's description of a result: the normalised request, seed, timings and LoRAs."""
    request = result.request
    return {
        "seed": result.seed,
        "seeds": list(result.seeds),
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "width": request.width,
        "height": request.height,
        "steps": request.steps,
        "guidance": request.guidance,
        "sampler": request.sampler,
        "scheduler": request.scheduler,
        "scheduler_options": dict(request.scheduler_options),
        "clip_skip": request.clip_skip,
        # Text-to-image, image-to-image, inpainting, text- or image-to-video; the strength an image run used.
        "mode": result.mode,
        "strength": request.strength,
        # Where each default that is not the model's came from (a speed LoRA, a card's recommendation).
        "defaults_from": dict(request.defaults_from),
        # Each LoRA's step-0 scale, and its schedule where it has one, in the form `POST /` takes it.
        "loras": [asdict(a) | schedule_fields(spec) for a, spec in zip(result.adapters, _specs(result), strict=True)],
        "swapped": result.swapped,
        "timings": asdict(result.timings),
        "warnings": list(result.warnings),
    }


def result_html(result: GenerateResult) -> str:
    """Seed and size, a timing breakdown with bars, each LoRA's strength (its window or schedule where it has one:
    `engine.schedules.strength_text`, as a comparison's captions) and cache hit or miss, and warnings."""
    t, request = result.timings, result.request
    phases = (("download / resolve", t.resolve), ("prepare", t.prepare), ("swap", t.apply), ("inference", t.inference))
    longest = max(max(v for _, v in phases), 1e-9)
    rows = "".join(
        f'<tr><td>{name}</td><td>{seconds(v)}</td><td style="width:60%"><div class="bar" '
        f'style="width:{100 * v / longest:.1f}%"></div></td></tr>'
        for name, v in phases
    )
    rows += f"<tr><td><b>total</b></td><td><b>{seconds(t.total)}</b></td><td></td></tr>"
    loras = "".join(
        f'<li><code>{_esc(a.ref)}</code> × {_esc(strength_text(spec))} — cache <span class="badge'
        f'{" ok" if a.cache == "hit" else ""}">{a.cache}</span></li>'
        for a, spec in zip(result.adapters, _specs(result), strict=True)
    )
    warnings = "".join(f"<p>⚠ {_esc(w)}</p>" for w in result.warnings)
    seeds = ", ".join(f"<code>{seed}</code>" for seed in result.seeds)
    skip = f" · CLIP skip {request.clip_skip + 1}" if request.clip_skip else ""
    sources = "".join(f"<li>{_esc(field)}: {_esc(source)}</li>" for field, source in request.defaults_from)
    defaults = f"<p>Defaults from the LoRA:</p><ul class='defaults-from'>{sources}</ul>" if sources else ""
    return (
        f'<div class="result-info"><p><b>Seed</b> {seeds} · {request.width} × {request.height} · '
        f"{request.steps} steps · {_esc(request.sampler)} · guidance {request.guidance:g}{skip}</p>"
        f"<table class='timing'>{rows}</table>"
        f"<ul>{loras or '<li>no LoRA: the base model</li>'}</ul>{defaults}{warnings}</div>"
    )


def _specs(result: GenerateResult) -> list[LoraSpec]:
    """The request's LoRAs, its adapters' in order (as the recipe pairs them); a result read back may carry none."""
    if len(result.request.loras) == len(result.adapters):
        return list(result.request.loras)
    return [LoraSpec(a.ref, a.scale) for a in result.adapters]


def preview_html(step: int, steps: int | None) -> str:
    """The result panel's line while previews come in."""
    of = f" of {steps}" if steps else ""
    return f'<div class="result-info preview"><p>Preview after step {step}{of}: the image is forming…</p></div>'


def seconds(value: float) -> str:
    """A duration as the UI shows it: milliseconds below a second, else seconds."""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def catalog_json(result: CatalogPage) -> dict[str, Any]:
    """A catalogue page as the API answers it."""
    freshness = result.freshness
    return {
        "entries": [e.to_json() for e in result.entries],
        "page": result.page,
        "page_size": result.page_size,
        "total_known": result.total_known,
        "has_more": result.has_more,
        "freshness": {
            "source": freshness.source,
            "updated_at": freshness.updated_at.isoformat() if freshness.updated_at else None,
            "offline": freshness.offline,
            "message": freshness.message,
        },
    }
