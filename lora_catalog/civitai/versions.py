"""Civitai's answers read into frozen records, and this Space's policy on them.

Fields of `GET /api/v1/model-versions/{id}` and `GET /api/v1/models/{id}` are read one by one; a missing
optional one degrades to nothing, a missing id or file list is an unreadable answer. The policy
(`check_version`): LoRAs only (LORA, LoCon, DoRA; anything else refused naming what it is), NSFW within the
configured ceiling (Civitai's `nsfwLevel` flags; a level that cannot be read is above every ceiling but the
top one), no early access, and one primary `.safetensors` file with a
SHA256 to check the download against. Fields and sources: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any
from urllib.parse import urlsplit

from ..cards import IMAGE_SUFFIXES
from ..entries import Family, LoraEntry, parse_datetime
from ..errors import (
    AmbiguousWeightsError,
    CivitaiUnavailableError,
    ContentPolicyError,
    NoSafetensorsError,
    NotALoraError,
    PickleOnlyError,
    RestrictedLoraError,
)
from ..hints import LoraHints, civitai_hints
from .bases import civitai_base
from .refs import CivitaiRef

__all__ = [
    "CivitaiFile",
    "CivitaiVersion",
    "NsfwLevel",
    "check_version",
    "latest_version_id",
    "parse_nsfw_level",
    "parse_version",
]

# Civitai's model types that are LoRAs the engine fuses (LoCon covers LyCORIS files: LoHa, LoKr, LoCon).
LORA_TYPES = ("LORA", "LoCon", "DoRA")
_TYPE_NAMES = {
    "checkpoint": "a checkpoint",
    "textualinversion": "an embedding (textual inversion)",
    "hypernetwork": "a hypernetwork",
    "aestheticgradient": "an aesthetic gradient",
    "controlnet": "a ControlNet",
    "vae": "a VAE",
    "upscaler": "an upscaler",
    "motionmodule": "a motion module",
    "poses": "a pose pack",
    "wildcards": "a wildcard list",
    "workflows": "a workflow",
}
_MODEL_FILE_TYPES = ("model", "pruned model")
_PICKLE_FORMATS = ("pickletensor",)
_MAX_PREVIEWS = 4


class NsfwLevel(IntEnum):
    """Civitai's rating bits, each level one bit (a version's `nsfwLevel` ORs those of its images)."""

    PG = 1
    PG13 = 2
    R = 4
    X = 8
    XXX = 16

    @property
    def allowed_bits(self) -> int:
        """Every level up to this one."""
        return (self.value << 1) - 1

    @property
    def label(self) -> str:
        return "PG-13" if self is NsfwLevel.PG13 else self.name


_BLOCKED = 32
_TOP = max(NsfwLevel)  # the ceiling that allows every level


def parse_nsfw_level(value: str) -> NsfwLevel:
    """`PG`, `PG13` (or `PG-13`), `R`, `X`, `XXX`, any case; ValueError naming the accepted ones otherwise."""
    key = value.strip().upper().replace("-", "")
    if key not in NsfwLevel.__members__:
        raise ValueError(f"{value!r} is not an NSFW level; accepted: PG, PG13, R, X, XXX")
    return NsfwLevel[key]


@dataclass(frozen=True)
class CivitaiFile:
    """The one file of a version this Space downloads."""

    file_id: int | None
    name: str
    size: int | None
    sha256: str
    download_url: str


@dataclass(frozen=True)
class CivitaiVersion:
    """One model version as the API described it (files other than the chosen one left out)."""

    version_id: int
    model_id: int
    model_name: str
    version_name: str
    model_type: str
    base_model: str
    model_nsfw: bool
    nsfw_level: int | None
    status: str | None
    availability: str | None
    early_access_ends: datetime | None
    trained_words: tuple[str, ...]
    files: tuple[Mapping[str, Any], ...]
    images: tuple[tuple[str, int | None], ...]
    downloads: int
    likes: int
    published_at: datetime | None
    air: str | None
    clip_skip: int | None  # A1111's count, as Civitai states it (2: one text-encoder layer skipped)
    recommended: tuple[tuple[str, float], ...]

    @property
    def ref(self) -> str:
        return CivitaiRef(self.model_id, self.version_id).canonical

    @property
    def title(self) -> str:
        return f"{self.model_name} ({self.version_name})" if self.version_name else self.model_name

    @property
    def hints(self) -> LoraHints:
        """What its page recommends for the controls (its clipSkip; a speed LoRA's preset by its names)."""
        return civitai_hints(self.clip_skip, (self.model_name, self.version_name))

    def page_url(self, site: str) -> str:
        return f"{site.rstrip('/')}/models/{self.model_id}?modelVersionId={self.version_id}"

    def entry(self, site: str, ceiling: NsfwLevel, file: CivitaiFile | None = None) -> LoraEntry:
        """The catalogue's entry (previews only of images rated within `ceiling`)."""
        base = civitai_base(self.base_model)
        previews = tuple(url for url, level in self.images if _shown(level, ceiling))
        return LoraEntry(
            ref=self.ref,
            repo_id=None,
            title=self.title,
            base_models=(base.base_model_id,) if base else (),
            family=base.family if base else Family.UNKNOWN,
            trigger_words=self.trained_words,
            preview_urls=previews[:_MAX_PREVIEWS],
            downloads=self.downloads,
            likes=self.likes,
            last_modified=self.published_at,
            weight_name=file.name if file else None,
            weight_size=file.size if file else None,
            tags=(f"civitai-base:{self.base_model}",) if self.base_model else (),
            sha=file.sha256 if file else None,
            source="civitai",
            page_url=self.page_url(site),
            hints=self.hints,
            recommended=self.recommended,
        )


def parse_version(document: object, where: str) -> CivitaiVersion:
    """A version from `/model-versions/{id}`; CivitaiUnavailableError naming `where` when it is unreadable."""
    if not isinstance(document, Mapping):
        raise CivitaiUnavailableError(f"Civitai answered {where} with a JSON {type(document).__name__}, not an object")
    version_id, model_id = _positive(document.get("id")), _positive(document.get("modelId"))
    files = document.get("files")
    if version_id is None or model_id is None or not isinstance(files, list):
        raise CivitaiUnavailableError(f"Civitai answered {where} without a version id, model id or file list")
    model = _mapping(document.get("model"))
    settings = _mapping(document.get("settings"))
    stats = _mapping(document.get("stats"))
    clip_skip = _positive(document.get("clipSkip")) or _positive(settings.get("clipSkip"))
    named = (("strength", "strength"), ("min_strength", "minStrength"), ("max_strength", "maxStrength"))
    recommended = tuple((name, float(settings[key])) for name, key in named if _number(settings.get(key)))
    images = tuple(
        (image["url"], _level(image.get("nsfwLevel")))
        for image in document.get("images") or ()
        if isinstance(image, Mapping) and _raster_url(image.get("url")) and image.get("type", "image") == "image"
    )
    return CivitaiVersion(
        version_id=version_id,
        model_id=model_id,
        model_name=_text(model.get("name")) or f"Civitai model {model_id}",
        version_name=_text(document.get("name")),
        model_type=_text(model.get("type")),
        base_model=_text(document.get("baseModel")),
        model_nsfw=model.get("nsfw") is True,
        nsfw_level=_level(document.get("nsfwLevel")),
        status=_text(document.get("status")) or None,
        availability=_text(document.get("availability")) or None,
        early_access_ends=parse_datetime(document.get("earlyAccessEndsAt")),
        trained_words=tuple(dict.fromkeys(w.strip() for w in document.get("trainedWords") or () if _text(w))),
        files=tuple(f for f in files if isinstance(f, Mapping)),
        images=images,
        downloads=_positive(stats.get("downloadCount")) or 0,
        likes=_positive(stats.get("thumbsUpCount")) or 0,
        published_at=parse_datetime(document.get("publishedAt")),
        air=_text(document.get("air")) or None,
        clip_skip=clip_skip if clip_skip is not None and clip_skip <= 12 else None,
        recommended=recommended,
    )


def latest_version_id(document: object, where: str) -> int:
    """The latest published version of a model from `/models/{id}`: the most recently published one (Civitai
    lists only published versions there; by id when dates are missing)."""
    versions = document.get("modelVersions") if isinstance(document, Mapping) else None
    if not isinstance(versions, list):
        raise CivitaiUnavailableError(f"Civitai answered {where} without a list of model versions")
    if isinstance(document, Mapping):
        _check_type(_text(document.get("type")), f"Civitai model {document.get('id')}")
    published = [
        (parse_datetime(v.get("publishedAt")) or datetime.min.replace(tzinfo=UTC), _positive(v.get("id")) or 0)
        for v in versions
        if isinstance(v, Mapping) and _positive(v.get("id")) and v.get("status", "Published") == "Published"
    ]
    if not published:
        raise RestrictedLoraError(f"{where} has no published version anyone can download")
    return max(published)[1]


def check_version(version: CivitaiVersion, ceiling: NsfwLevel, *, now: datetime | None = None) -> CivitaiFile:
    """The file to download, once the version passes the policy (see the module doc); raises naming why not."""
    label = f"Civitai {version.ref!r} ({version.title})"
    _check_type(version.model_type, label)
    _check_nsfw(version, ceiling, label)
    now = now or datetime.now(UTC)
    if (version.availability or "").lower() == "earlyaccess" or (
        version.early_access_ends is not None and version.early_access_ends > now
    ):
        ends = f" until {version.early_access_ends:%Y-%m-%d %H:%M} UTC" if version.early_access_ends else ""
        raise RestrictedLoraError(
            f"{label} is in early access{ends}: only its supporters may download it; accepted: publicly "
            "downloadable versions"
        )
    if version.status not in (None, "Published"):
        raise RestrictedLoraError(f"{label} is not published (status {version.status}); accepted: published versions")
    return choose_file(version.files, label)


def choose_file(files: Sequence[Mapping[str, Any]], label: str) -> CivitaiFile:
    """The primary `.safetensors` model file, else the only one; pickles are refused as on the Hub."""
    models = [f for f in files if _text(f.get("type")).lower() in _MODEL_FILE_TYPES or not f.get("type")]
    safe = model_files(files)
    primary = [f for f in safe if f.get("primary") is True]
    chosen = primary or safe
    if not chosen:
        names = ", ".join(_text(f.get("name")) or "?" for f in models) or "none"
        if any(_is_pickle(f) for f in models):
            raise PickleOnlyError(
                f"{label} has only pickle weight files ({names}), which are never unpickled; accepted: a version "
                "with a .safetensors file"
            )
        raise NoSafetensorsError(f"{label} has no .safetensors model file (files: {names})")
    if len(chosen) > 1:
        candidates = tuple(_text(f.get("name")) for f in chosen)
        raise AmbiguousWeightsError(
            f"{label} has several .safetensors model files and none is primary: {', '.join(candidates)}", candidates
        )
    return describe_file(chosen[0], label)


def model_files(files: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A version's `.safetensors` model files (its LoRA's, not training data or pickles)."""
    models = [f for f in files if _text(f.get("type")).lower() in _MODEL_FILE_TYPES or not f.get("type")]
    return [f for f in models if _is_safetensors(f)]


def describe_file(file: Mapping[str, Any], label: str) -> CivitaiFile:
    """One file of a version as this Space downloads it: its name, URL and SHA256 (refused without them)."""
    name, url = _text(file.get("name")), _text(file.get("downloadUrl"))
    hashes = _mapping(file.get("hashes"))
    sha256 = _text(hashes.get("SHA256")).lower()
    if not name or not url:
        raise CivitaiUnavailableError(f"Civitai described the file of {label} without a name or download URL")
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise CivitaiUnavailableError(
            f"Civitai gave no SHA256 for {name!r} of {label}, so its download could not be checked"
        )
    size_kb = file.get("sizeKB")
    size = math.ceil(size_kb * 1024) if isinstance(size_kb, int | float) and _number(size_kb) and size_kb >= 0 else None
    return CivitaiFile(_positive(file.get("id")), name, size, sha256, url)


def _check_type(model_type: str, label: str) -> None:
    if model_type.lower() in (t.lower() for t in LORA_TYPES):
        return
    what = _TYPE_NAMES.get(model_type.lower(), f"a {model_type or 'model of unknown type'}")
    raise NotALoraError(f"{label} is {what}, not a LoRA; accepted: Civitai models of type {', '.join(LORA_TYPES)}")


def _check_nsfw(version: CivitaiVersion, ceiling: NsfwLevel, label: str) -> None:
    accepted = f"accepted here: LoRAs rated up to {ceiling.label} (CIVITAI_MAX_NSFW_LEVEL)"
    if version.model_nsfw and ceiling < NsfwLevel.R:
        raise ContentPolicyError(f"{label} is marked NSFW by Civitai; {accepted}")
    level = version.nsfw_level
    if level is None:
        # Unreadable or missing: it may be any level, so it passes only a ceiling that allows every level.
        if ceiling is _TOP:
            return
        raise ContentPolicyError(f"{label} has no NSFW rating that could be read in Civitai's answer; {accepted}")
    if level == 0 and ceiling < NsfwLevel.XXX:
        raise ContentPolicyError(f"{label} has no NSFW rating on Civitai yet; {accepted}")
    if not _within(level, ceiling):
        rated = "/".join(lv.label for lv in NsfwLevel if level & lv) or "blocked"
        raise ContentPolicyError(f"{label} is rated {rated} on Civitai; {accepted}")


def _within(level: int, ceiling: NsfwLevel) -> bool:
    return level != 0 and not (level & _BLOCKED) and not (level & ~ceiling.allowed_bits)


def _shown(level: int | None, ceiling: NsfwLevel) -> bool:
    """Whether a preview rated `level` is shown (unreadable: only where every level is allowed)."""
    return ceiling is _TOP if level is None else _within(level, ceiling)


def _is_safetensors(file: Mapping[str, Any]) -> bool:
    metadata = _mapping(file.get("metadata"))
    fmt = _text(metadata.get("format")).lower()
    return fmt == "safetensor" or (not fmt and _text(file.get("name")).lower().endswith(".safetensors"))


def _is_pickle(file: Mapping[str, Any]) -> bool:
    metadata = _mapping(file.get("metadata"))
    name = _text(file.get("name")).lower()
    return _text(metadata.get("format")).lower() in _PICKLE_FORMATS or name.endswith((".pt", ".ckpt", ".bin", ".pth"))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _level(value: object) -> int | None:
    """An `nsfwLevel` in any JSON form of a whole number >= 0 (16, 16.0, "16"); None when it is not one."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _raster_url(url: object) -> bool:
    """Whether a Civitai image URL may be a preview: https, a raster image's path, and no query or fragment.

    Gradio's Gallery downloads an `.svg` on the server, with no size limit, to inline it, and it reads the whole
    string, not the path: `.../a.png?.svg` would pass a path check, so a query or fragment is refused outright.
    """
    if not isinstance(url, str) or any(c in url for c in "?#"):
        return False
    split = urlsplit(url)
    return split.scheme == "https" and bool(split.netloc) and split.path.lower().endswith(IMAGE_SUFFIXES)
