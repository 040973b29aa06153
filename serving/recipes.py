"""Images that carry their recipe: A1111's `parameters` text, the form A1111, Civitai and most tools read.

Each LoRA is an A1111 `<lora:NAME:weight>` tag after the prompt with A1111's hash (kohya's addnet hash); values
holding `,`, `:` or a newline are quoted as A1111 quotes them. A prompt cannot add structure: a `<name:` tag,
"Negative prompt:" or a leading "Steps:" in it gets one more space (`_ESCAPES`), so a recipe names exactly the
LoRAs that ran. An IC-LoRA run's reference video is named, never carried (`VideoReference`: its file's SHA-256,
frames and size, and the run's `reference_strength` / `reference_downscale`), and a recipe read back names it apart
from its request, which lacks it (`Recipe.reference_video`).
`with_recipes` puts the recipe in `info["parameters"]`, `encode_image` writes it as a PNG text chunk or JPEG EXIF,
`parse_recipe` reads it back. `RECIPES=0` turns recipes off.
The format, with an example: docs/internals.md, "serving/recipes.py".
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image, PngImagePlugin

from engine.requests import GenerateRequest, GenerateResult, InputImage, LoraSpec
from engine.samplers import find_sampler
from engine.schedules import window_of
from engine.video_input import EncodedVideo, RequestVideo
from lora_catalog.pairs import SEPARATOR as PAIR_SEPARATOR

if TYPE_CHECKING:
    from engine.requests import AdapterUse

__all__ = [
    "KEY",
    "REFERENCE_VIDEO",
    "Recipe",
    "VideoReference",
    "encode_image",
    "image_hash",
    "parse_recipe",
    "recipe_text",
    "with_recipes",
]

KEY = "parameters"
VERSION = "LoRA Switchboard"
# Each LoRA's low-noise scale on a two-stage pool (Wan 2.2 A14B), where it differs from its tag's.
SCALES_2 = "Lora scales 2"
# An IC-LoRA run's reference video (`VideoReference.text`), the one parameter written and read back under this name.
REFERENCE_VIDEO = "Reference video"
_VIDEO_TEXT = re.compile(
    r"(?:sha256 ([0-9a-f]{64}), )?(\d+) frames, (\d+)x(\d+)(?:, strength ([0-9.eE+-]+))?(?:, downscale (\d+))?"
)
_JPEG_QUALITY = 92
_EXIF_IFD, _USER_COMMENT = 0x8769, 0x9286
_UNICODE = b"UNICODE\x00"
_LOCAL = "~"
_PREFERRED = "pytorch_lora_weights.safetensors"
# A1111's own grammar for the parameters line (modules/infotext_utils.py, re_param_code).
_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_LORA_TAG = re.compile(r"\s*<lora:([^>]+)>")
# A tag's schedule fields after its weight (`start=0`, `end=0.25`, `schedule=0@1;0.5@0`), read from its end.
_TAG_FIELD = re.compile(r":(start|end|schedule)=([-0-9.e@;]*)$")
# User text that a reader would take for the recipe's own structure: an extra-network tag (A1111 applies any
# `<name:...>` in a prompt; Civitai lists `<lora:...>` as a resource), "Negative prompt:" (Civitai splits there
# anywhere, A1111 at a line's start) and a line starting "Steps:" (Civitai's parameters line). A1111 has no
# escape for them, so each gets one more space (`< lora:`, `Negative prompt :`, `Steps :`), which no reader takes
# for structure and which `parse_recipe` takes away again in a recipe of ours: the prompt reads back as written.
_ESCAPED = (("<", r"(?=\w+:)"), ("Negative prompt", ":"), ("^Steps", ":"))  # (before, after) the added space
_ESCAPES = tuple(
    (re.compile(f"({before})( *)({after})", re.M), re.compile(f"({before}) ( *)({after})", re.M))
    for before, after in _ESCAPED
)


@dataclass(frozen=True)
class VideoReference:
    """An IC-LoRA run's reference video as its recipe names it (`Reference video`), never its bytes: the SHA-256 of
    the file the client sent (what `sha256sum` prints for it; "" for a video made in code, which has no file), its
    frame count and a frame's size; and the run's in-context settings where the request set them
    (`reference_strength`, `reference_downscale`: None for diffusers' defaults). Written `sha256 <64 hex digits>,
    9 frames, 64x64` (then `, strength 0.25`, `, downscale 2` where set)."""

    sha256: str
    frames: int
    width: int
    height: int
    strength: float | None = None
    downscale: int | None = None

    @classmethod
    def of(cls, video: RequestVideo, strength: float | None = None, downscale: float | None = None) -> VideoReference:
        """The video a request ran with: decoded (its frames, its file kept) or as a door read it (its header), and
        the request's in-context settings."""
        if isinstance(video, EncodedVideo):
            digest, frames, width, height = (
                hashlib.sha256(video.data).hexdigest(),
                video.frames,
                video.width,
                video.height,
            )
        else:
            first = video.frames[0]
            digest = hashlib.sha256(video.source).hexdigest() if video.source else ""
            frames, width, height = len(video.frames), first.width, first.height
        # A checked downscale is a whole number (`reference_downscale`), written as one.
        return cls(digest, frames, width, height, strength, None if downscale is None else int(downscale))

    @classmethod
    def parse(cls, text: str) -> VideoReference | None:
        """The video `text` names (as `text()` writes it), or None for text of another form."""
        found = _VIDEO_TEXT.fullmatch(text.strip())
        if found is None:
            return None
        digest, frames, width, height, strength, downscale = found.groups()
        settings = (None if strength is None else float(strength), None if downscale is None else int(downscale))
        return cls(digest or "", int(frames), int(width), int(height), *settings)

    def text(self) -> str:
        named = f"sha256 {self.sha256}, " if self.sha256 else ""
        strength = "" if self.strength is None else f", strength {self.strength:g}"
        downscale = "" if self.downscale is None else f", downscale {self.downscale}"
        return f"{named}{self.frames} frames, {self.width}x{self.height}{strength}{downscale}"


@dataclass(frozen=True)
class Recipe:
    """A recipe read back: the request it describes, and every parameter as written (A1111's names).

    `reference_video`: the reference video an IC-LoRA run took (None: none), which the recipe names but cannot
    carry. `request` has no video then: alone it is a text-to-video run, not the recipe's; the same run needs that
    file (its SHA-256 tells it) as the request's `reference_video`."""

    request: GenerateRequest
    parameters: dict[str, str]
    hashes: dict[str, str]
    reference_video: VideoReference | None = None


def recipe_text(result: GenerateResult, index: int = 0) -> str:
    """The recipe of the result's `index`-th image (its own seed)."""
    request = result.request
    # The request's LoRAs are its adapters', in order (their schedules); a result read back may carry none.
    specs = request.loras if len(request.loras) == len(result.adapters) else (None,) * len(result.adapters)
    tags = "".join(f" <lora:{_lora_name(u)}:{_weight(u, s)}>" for u, s in zip(result.adapters, specs, strict=True))
    lines = [f"{_escape(request.prompt)}{tags}"]
    if request.negative_prompt:
        lines.append(f"Negative prompt: {_escape(request.negative_prompt)}")
    parameters: dict[str, object] = {
        "Steps": request.steps,
        "Sampler": request.sampler,
        "CFG scale": f"{request.guidance:g}",
        "Seed": result.seeds[index],
        "Size": f"{request.width}x{request.height}",
        "Model": result.model_id,
    }
    # A1111's img2img and inpaint tabs write the strength so; a recipe cannot hold the input image itself.
    if request.image is not None and request.strength is not None:
        parameters["Denoising strength"] = f"{request.strength:g}"
    if request.clip_skip:
        parameters["Clip skip"] = request.clip_skip + 1
    if result.is_video:
        # A video's length and rate; a two-stage pool's low-noise guidance beside `CFG scale` (the high-noise one).
        parameters["Frames"] = request.num_frames
        parameters["FPS"] = request.fps
        if request.guidance_2 is not None:
            parameters["CFG scale 2"] = f"{request.guidance_2:g}"
    if request.image is not None and request.images:
        # The images themselves are not carried: how many, and each one's pixels' short SHA-256, in the order
        # they ran (the prompt's "image 1", "image 2", ...).
        references = (request.image, *request.images)
        parameters["Reference images"] = len(references)
        parameters["Reference hashes"] = ", ".join(
            f"image {n}: {image_hash(image)}" for n, image in enumerate(references, start=1)
        )
    if request.reference_video is not None:
        # Nor an IC-LoRA's reference video: which file it was, how long and how large, and how it was taken.
        video = VideoReference.of(request.reference_video, request.reference_strength, request.reference_downscale)
        parameters[REFERENCE_VIDEO] = video.text()
    hashes = [f"{_lora_name(use)}: {use.hash}" for use in result.adapters if use.hash]
    if hashes:
        parameters["Lora hashes"] = ", ".join(hashes)
    # A two-stage pool's low-noise scales where they differ from the tag's (high-noise) one, named like `CFG scale
    # 2`: A1111 reads a third `<lora:...>` field as its own (the UNet's weight), so they cannot go in the tag.
    lows = [f"{_lora_name(use)}: {use.scale_2:g}" for use in result.adapters if use.scale_2 is not None]
    if lows:
        parameters[SCALES_2] = ", ".join(lows)
    # A pair's two files (a two-stage pool's high- and low-noise halves), which its name alone does not say.
    pairs = [f"{_lora_name(u)} ({u.files})" for u in result.adapters if u.files]
    if pairs:
        parameters["Lora pairs"] = "; ".join(pairs)
    parameters["Version"] = VERSION
    lines.append(", ".join(f"{key}: {_quote(str(value))}" for key, value in parameters.items() if value != ""))
    return "\n".join(lines)


def image_hash(image: InputImage) -> str:
    """An input image's short SHA-256 (12 hex digits) over its size, mode and pixels: the same picture gives the
    same hash whichever file format or transport carried it."""
    digest = hashlib.sha256(f"{image.width}x{image.height} {image.mode}\n".encode())
    digest.update(image.data)
    return digest.hexdigest()[:12]


def with_recipes(result: GenerateResult) -> GenerateResult:
    """The result with each image a copy holding its own recipe in `info["parameters"]`."""
    images = []
    for index, image in enumerate(result.images):
        copy = image.copy()
        copy.info[KEY] = recipe_text(result, index)
        images.append(copy)
    return dataclasses.replace(result, image=images[0], more_images=tuple(images[1:]))


def encode_image(image: Image.Image, media_type: str) -> bytes:
    """PNG, or JPEG at a fixed quality; the image's recipe (if it holds one) as a PNG text chunk or EXIF."""
    recipe = image.info.get(KEY)
    buffer = io.BytesIO()
    if media_type == "image/png":
        info = None
        if isinstance(recipe, str):
            info = PngImagePlugin.PngInfo()
            info.add_text(KEY, recipe)  # iTXt when the text is not latin-1
        image.save(buffer, format="PNG", pnginfo=info)
    else:
        options: dict[str, object] = {}
        if isinstance(recipe, str):
            exif = Image.Exif()
            exif.endian = ">"
            exif.get_ifd(_EXIF_IFD)[_USER_COMMENT] = _UNICODE + recipe.encode("utf-16-be")
            options["exif"] = exif
        image.convert("RGB").save(buffer, format="JPEG", quality=_JPEG_QUALITY, **options)
    return buffer.getvalue()


def read_recipe(image: Image.Image) -> str | None:
    """The recipe an opened PNG or JPEG holds (its text chunk, or its EXIF UserComment), or None."""
    text = image.info.get(KEY)
    if isinstance(text, str):
        return text
    comment = image.getexif().get_ifd(_EXIF_IFD).get(_USER_COMMENT)
    if isinstance(comment, bytes) and comment.startswith(_UNICODE):
        return comment[len(_UNICODE) :].decode("utf-16-be")
    return None


def parse_recipe(text: str) -> Recipe:
    """A recipe's request: prompt and LoRA tags, negative prompt, steps, sampler, CFG, seed, size, clip skip,
    and an image-to-image recipe's denoising strength; an IC-LoRA recipe's reference video named beside it."""
    lines = text.strip().split("\n")
    found = _PARAM.findall(lines[-1]) if lines else []
    parameters = {key.strip(): _unquote(value) for key, value in found} if len(found) >= 3 else {}
    body = lines[:-1] if parameters else lines
    prompt_lines: list[str] = []
    negative_lines: list[str] = []
    negative = False
    for line in body:
        if line.startswith("Negative prompt:"):
            negative, line = True, line.removeprefix("Negative prompt:").strip()
        (negative_lines if negative else prompt_lines).append(line)
    prompt = "\n".join(prompt_lines)
    lows = _named(parameters.get(SCALES_2, ""))
    loras = tuple(_lora_spec(tag, lows) for tag in _LORA_TAG.findall(prompt))
    # Only our own recipes escape their text (another tool's "< lora:x>" is that prompt's own text).
    ours = _unescape if parameters.get("Version") == VERSION else str
    width, _, height = parameters.get("Size", "").partition("x")
    sampler = find_sampler(parameters.get("Sampler", ""), parameters.get("Schedule type", ""))
    clip_skip = _number(parameters.get("Clip skip"))
    request = GenerateRequest(
        prompt=ours(_LORA_TAG.sub("", prompt).strip()),
        negative_prompt=ours("\n".join(negative_lines).strip()),
        loras=loras,
        steps=_number(parameters.get("Steps")),
        guidance=_number(parameters.get("CFG scale")),
        width=_number(width),
        height=_number(height),
        seed=_number(parameters.get("Seed")),
        scheduler=sampler.label if sampler is not None else (parameters.get("Sampler") or None),
        clip_skip=clip_skip - 1 if clip_skip is not None else None,
        # An image-to-image recipe's strength; the image it started from is the caller's to give.
        strength=_number(parameters.get("Denoising strength")),
        # A video recipe's frames, rate and low-noise guidance (none in an image's).
        num_frames=_number(parameters.get("Frames")),
        fps=_number(parameters.get("FPS")),
        guidance_2=_number(parameters.get("CFG scale 2")),
    )
    hashes = {_ref(name): value for name, value in _named(parameters.get("Lora hashes", "")).items()}
    # The reference video stays apart from the request (which cannot hold a video that is not there).
    return Recipe(request, parameters, hashes, VideoReference.parse(parameters.get(REFERENCE_VIDEO, "")))


def _escape(text: str) -> str:
    for plain, _ in _ESCAPES:
        text = plain.sub(r"\1 \2\3", text)
    return text


def _unescape(text: str) -> str:
    for _, escaped in _ESCAPES:
        text = escaped.sub(r"\1\2\3", text)
    return text


def _lora_name(use: AdapterUse) -> str:
    if use.ref.startswith("local:"):
        return _LOCAL + use.ref.removeprefix("local:")
    if use.files:
        # A pair ("high: a, low: b"): its weight name as a request gives it back (`lora_catalog.pairs`); a Civitai
        # version names its files itself.
        high, _, low = use.files.removeprefix("high: ").partition(", low: ")
        return use.ref if use.ref.startswith("civitai:") else f"{use.ref}/{high}{PAIR_SEPARATOR}{low}"
    return use.ref if use.weight_name in ("", _PREFERRED) else f"{use.ref}/{use.weight_name}"


def _named(text: str) -> dict[str, str]:
    """`name: value, name: value` (`Lora hashes`, `Lora scales 2`) as a dict by name."""
    return dict(part.split(": ", 1) for part in text.split(", ") if ": " in part)


def _weight(use: AdapterUse, spec: LoraSpec | None) -> str:
    """A tag's weight and its schedule (`engine.schedules`) in Forge's form: `1:start=0:end=0.25` for a window
    (the scale on [start, end), 0 elsewhere), else `0.4:schedule=0@0.4;0.5@0.9` (each segment's from@scale)."""
    schedule = spec.schedule if spec is not None else ()
    if not schedule:
        return f"{use.scale:g}"
    if (window := window_of(schedule)) is not None:
        scale, start, end = window
        return f"{scale:g}:start={start:g}" + (f":end={end:g}" if end < 1 else "")
    return f"{use.scale:g}:schedule=" + ";".join(f"{f:g}@{value:g}" for f, value in schedule)


def _lora_spec(tag: str, lows: dict[str, str]) -> LoraSpec:
    """A `<lora:NAME:weight>` tag as a LoraSpec, with its low-noise scale from `lows` (by NAME) if it has one, and
    its schedule from the fields after the weight (`start=`, `end=`, `schedule=`: `_weight`)."""
    fields: dict[str, str] = {}
    while (found := _TAG_FIELD.search(tag)) is not None:
        fields[found.group(1)] = found.group(2)
        tag = tag[: found.start()]
    spec = _scaled_spec(tag, lows)
    schedule = tuple(
        (float(f), float(v)) for f, _, v in (p.partition("@") for p in fields.get("schedule", "").split(";") if p)
    )
    return dataclasses.replace(
        spec, schedule=schedule, start=_number(fields.get("start")), end=_number(fields.get("end"))
    )


def _scaled_spec(tag: str, lows: dict[str, str]) -> LoraSpec:
    name, _, weight = tag.rpartition(":")
    scale = _number(weight)
    if not name:  # <lora:name> without a weight
        name, scale = weight, 1.0
    scale = 1.0 if scale is None else scale
    scale_2 = _number(lows.get(name))
    parts = _ref(name).split("/")
    if not name.startswith(_LOCAL) and len(parts) > 2:
        return LoraSpec("/".join(parts[:2]), scale, weight_name="/".join(parts[2:]), scale_2=scale_2)
    return LoraSpec(_ref(name), scale, scale_2=scale_2)


def _ref(name: str) -> str:
    return f"local:{name.removeprefix(_LOCAL)}" if name.startswith(_LOCAL) else name


def _quote(text: str) -> str:
    """A1111's quoting: only values with a comma, a colon or a newline, as JSON strings."""
    return json.dumps(text, ensure_ascii=False) if any(c in text for c in ",:\n") else text


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            return str(json.loads(text))
        except json.JSONDecodeError:
            return text
    return text


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return int(value) if value is not None and value.is_integer() else value
