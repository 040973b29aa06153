"""Turning one Hub model record (listing item or model_info) into a `LoraEntry`.

Model cards are written by hand and often wrong: `base_model` as an int,
`widget` as a string, licenses spelled a dozen ways. Everything here degrades
field by field; only a record without a usable repo id is rejected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlsplit

from .bases import family_of_base
from .entries import Family, LoraEntry, parse_datetime
from .errors import AmbiguousWeightsError, InvalidRequestError, LoraNotFoundError, NoSafetensorsError, PickleOnlyError
from .hints import card_hints, speed_hints
from .pivotal import embeddings_for, is_embeddings_file, with_token_triggers

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_REPO_ID_CHARS",
    "PICKLE_SUFFIXES",
    "PREFERRED_WEIGHT_NAME",
    "REPO_ID_PATTERN",
    "VIDEO_SUFFIXES",
    "choose_weight",
    "entry_from_hub_item",
    "is_non_commercial",
    "pick_weight_name",
    "resolve_url",
]

PREFERRED_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".webp", ".gif")
# A video LoRA's card previews (Wan's): MP4 only, the one container every browser plays as H.264.
VIDEO_SUFFIXES: tuple[str, ...] = (".mp4",)
PICKLE_SUFFIXES: tuple[str, ...] = (".bin", ".ckpt", ".pt", ".pth")
# The Hub's own rule for repo ids: owner/name of letters, digits, '-', '_', '.'; no '--' or '..' runs.
REPO_ID_PATTERN = re.compile(r"^(?!.*(?:--|\.\.))[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_REPO_ID_CHARS = 96
_MAX_PREVIEWS = 4
_FILE_URL_KINDS = ("resolve", "blob", "raw")  # the Hub's URLs of one file of a repo at a revision
_NON_COMMERCIAL = re.compile(r"(^|[^a-z])nc([^a-z]|$)|non[-_ ]?commercial|research[-_ ]only|noncommercial")


def is_non_commercial(license: str | None, license_name: str | None = None, license_link: str | None = None) -> bool:
    """Whether a card's license forbids commercial use (cc-by-nc-*, FLUX.1 [dev]'s, research-only, ...).

    openrail/openrail++, apache, mit and cc-by(-sa) are commercial. Cards imported
    from Civitai carry the creator's choice in the link (`allowCommercialUse=None`).
    """
    text = " ".join(v.strip().lower() for v in (license, license_name) if isinstance(v, str))
    if _NON_COMMERCIAL.search(text):
        return True
    if isinstance(license_link, str) and "allowcommercialuse=" in license_link.lower():
        query = {k.lower(): v for k, v in parse_qs(urlsplit(license_link).query).items()}
        allowed = query.get("allowcommercialuse", [""])
        return all(v.strip().lower() in ("", "none", "false") for v in allowed)
    return False


def pick_weight_name(filenames: Iterable[str]) -> str | None:
    """The LoRA file of a repo: diffusers' default name if present, else the only `.safetensors`, else None.

    Pivotal-tuning embeddings files are never the LoRA (they load with it), so they are not candidates.
    """
    candidates = [f for f in filenames if _is_weight_candidate(f)]
    if PREFERRED_WEIGHT_NAME in candidates:
        return PREFERRED_WEIGHT_NAME
    return candidates[0] if len(candidates) == 1 else None


def entry_from_hub_item(item: Mapping[str, Any], *, endpoint: str, listed_base: str | None = None) -> LoraEntry:
    """Build an entry from a Hub JSON model record; raises ValueError only when the repo id is unusable."""
    repo_id = item.get("id", item.get("modelId"))
    if not isinstance(repo_id, str) or not REPO_ID_PATTERN.match(repo_id):
        raise ValueError(f"record has id {repo_id!r}; accepted: 'owner/name'")
    card = item.get("cardData")
    card = card if isinstance(card, Mapping) else {}
    sha = _str(item.get("sha"))
    siblings = _siblings(item.get("siblings"))
    tags = tuple(t for t in _strs(item.get("tags")) if ":" not in t)
    bases = _bases(card, _strs(item.get("tags")), listed_base)
    weight_name = pick_weight_name(siblings)
    embeddings_name = embeddings_for(weight_name, siblings)
    license_id = _first_str(card.get("license"))
    license_name = _str(card.get("license_name"))
    return LoraEntry(
        ref=repo_id,
        repo_id=repo_id,
        title=repo_id.split("/", 1)[1],
        base_models=bases,
        family=_family(bases, listed_base),
        trigger_words=_trigger_words(card, pivotal=embeddings_name is not None),
        preview_urls=_previews(card, siblings, endpoint, repo_id, sha),
        preview_videos=_previews(card, siblings, endpoint, repo_id, sha, VIDEO_SUFFIXES),
        license=license_name if license_name and license_id in (None, "other") else license_id,
        non_commercial=is_non_commercial(license_id, license_name, _str(card.get("license_link"))),
        downloads=_count(item.get("downloads")),
        likes=_count(item.get("likes")),
        trending_score=_number(item.get("trendingScore")),
        last_modified=parse_datetime(item.get("lastModified")),
        weight_name=weight_name,
        weight_size=siblings.get(weight_name) if weight_name else None,
        tags=tags,
        sha=sha,
        source="hub",
        embeddings_name=embeddings_name,
        embeddings_size=siblings.get(embeddings_name) if embeddings_name else None,
        # The card's own settings before a speed kind's generic ones.
        hints=card_hints(card).over(speed_hints([repo_id, weight_name, *tags], repo_id=repo_id)),
    )


def resolve_url(endpoint: str, repo_id: str, revision: str | None, path: str) -> str:
    """The Hub URL that serves one file of a repo."""
    return f"{endpoint.rstrip('/')}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/{quote(path)}"


def _bases(card: Mapping[str, Any], raw_tags: tuple[str, ...], listed_base: str | None) -> tuple[str, ...]:
    raw = card.get("base_model")
    found = [raw] if isinstance(raw, str) else list(_strs(raw))
    # The Hub derives these tags from the card and resolves them; they survive a card it rewrote.
    found += [t.split(":", 2)[2] for t in raw_tags if t.startswith("base_model:adapter:")]
    unique = tuple(dict.fromkeys(b.strip() for b in found if REPO_ID_PATTERN.match(b.strip())))
    if not unique and listed_base:
        return (listed_base,)
    return unique


def _family(bases: tuple[str, ...], listed_base: str | None) -> Family:
    known = [f for f in map(family_of_base, bases) if f is not Family.UNKNOWN]
    listed = family_of_base(listed_base) if listed_base else Family.UNKNOWN
    # The Hub listed it as an adapter of `listed_base`; a card naming several bases keeps that one's family.
    if listed is not Family.UNKNOWN and (listed in known or not known):
        return listed
    return known[0] if known else Family.UNKNOWN


def _trigger_words(card: Mapping[str, Any], *, pivotal: bool = False) -> tuple[str, ...]:
    prompt = card.get("instance_prompt")
    words = tuple(w.strip() for w in ((prompt,) if isinstance(prompt, str) else _strs(prompt)) if w.strip())
    texts = tuple(text for example in _widget(card) if (text := _str(example.get("text"))))
    if pivotal:
        # The new tokens (`<s0><s1>`) are the trigger; the file's row count is not read for a listing,
        # so they come from the card's texts.
        return with_token_triggers(words or texts[:1], (), *texts)
    return words or texts[:1]


def _previews(
    card: Mapping[str, Any],
    siblings: Mapping[str, int | None],
    endpoint: str,
    repo_id: str,
    sha: str | None,
    suffixes: tuple[str, ...] = IMAGE_SUFFIXES,
) -> tuple[str, ...]:
    """The card's widget outputs with one of `suffixes` (raster images, or MP4 videos), else the repo's files
    with one; as the Hub's resolve URLs, at most `_MAX_PREVIEWS`."""
    urls: list[str] = []
    for example in _widget(card):
        output = example.get("output")
        url = _str(output.get("url")) if isinstance(output, Mapping) else None
        if url:
            resolved = _preview_url(url, endpoint, repo_id, sha, suffixes)
            if resolved:
                urls.append(resolved)
    if not urls:
        urls = [resolve_url(endpoint, repo_id, sha, f) for f in siblings if f.lower().endswith(suffixes)]
    return tuple(dict.fromkeys(urls))[:_MAX_PREVIEWS]


def _preview_url(
    url: str, endpoint: str, repo_id: str, sha: str | None, suffixes: tuple[str, ...] = IMAGE_SUFFIXES
) -> str | None:
    """A card's preview (a raster image, or an MP4 with `VIDEO_SUFFIXES`) as the Hub's resolve URL, or None: not
    shown.

    Only a path in the repo, or a file URL on the Hub endpoint (`/{repo}/resolve|blob|raw/{revision}/{path}`),
    with one of `suffixes`. A URL elsewhere would be loaded by every visitor's browser, and Gradio's Gallery
    downloads an `.svg` on the server, with no size limit, to inline it. The URL shown is rebuilt from the file's
    path alone, so a Hub URL's query or fragment (`?download=true`) never reaches a browser; a repo path holding
    `?` or `#` (`a.svg?.png`) is refused, as the Civitai image rule refuses them.
    """
    split = urlsplit(url)
    revision: str | None = sha
    if split.scheme or split.netloc:
        found = _hub_file(split, endpoint)
        if found is None:
            return None
        repo_id, revision, path = found
    elif any(c in url for c in "?#"):
        return None
    else:
        path = url[2:] if url.startswith("./") else url
    parts = path.split("/")
    if "\\" in path or ".." in parts or not all(parts) or not path.lower().endswith(suffixes):
        return None
    return resolve_url(endpoint, repo_id, revision, path)


def _hub_file(split: SplitResult, endpoint: str) -> tuple[str, str, str] | None:
    """(repo id, revision, path) of a file URL on the Hub endpoint (same scheme, host and port), else None."""
    hub = urlsplit(endpoint)
    try:
        same_host = (split.scheme.lower(), split.hostname, split.port) == (hub.scheme.lower(), hub.hostname, hub.port)
    except ValueError:  # a port that is not a number
        return None
    prefix = hub.path.rstrip("/") + "/"
    if not same_host or split.username is not None or split.password is not None or not split.path.startswith(prefix):
        return None
    segments = split.path[len(prefix) :].split("/")
    repo_id = "/".join(segments[:2])
    if len(segments) < 5 or segments[2] not in _FILE_URL_KINDS or not REPO_ID_PATTERN.match(repo_id):
        return None
    return repo_id, unquote(segments[3]), "/".join(unquote(s) for s in segments[4:])


def _widget(card: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    widget = card.get("widget")
    return [w for w in widget if isinstance(w, Mapping)] if isinstance(widget, list) else []


def _siblings(raw: object) -> dict[str, int | None]:
    """File name -> size in bytes (None when the record has no sizes)."""
    files: dict[str, int | None] = {}
    if not isinstance(raw, list):
        return files
    for sibling in raw:
        if not isinstance(sibling, Mapping) or not _str(sibling.get("rfilename")):
            continue
        lfs = sibling.get("lfs")
        size = sibling.get("size")
        if size is None and isinstance(lfs, Mapping):
            size = lfs.get("size")
        files[sibling["rfilename"]] = size if isinstance(size, int) and not isinstance(size, bool) else None
    return files


def _str(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _first_str(value: object) -> str | None:
    if isinstance(value, list):
        return next((s for s in map(_str, value) if s), None)
    return _str(value)


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str))


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _count(value: object) -> int:
    return int(min(max(_number(value), 0.0), 2.0**62))


def choose_weight(where: str, files: tuple[str, ...], weight_name: str | None) -> str:
    """The LoRA file of a repo holding `files`: the one named, the preferred name, or the only .safetensors.

    A pivotal-tuning embeddings file is never the LoRA (it loads with it: `lora_catalog.pivotal`).
    """
    candidates = tuple(f for f in files if _is_weight_candidate(f))
    if weight_name is not None:
        listed = ", ".join(repr(c) for c in candidates) or "none"
        if weight_name not in files:
            raise LoraNotFoundError(
                f"file {weight_name!r} was not found in LoRA repo {where}; its .safetensors files: {listed}"
            )
        if is_embeddings_file(weight_name):
            raise InvalidRequestError(
                f"file {weight_name!r} of LoRA repo {where} is a pivotal-tuning embeddings file, which loads with "
                f"its LoRA; accepted: the LoRA weight file ({listed})"
            )
        return weight_name
    if PREFERRED_WEIGHT_NAME in candidates:
        return PREFERRED_WEIGHT_NAME
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise AmbiguousWeightsError(
            f"LoRA repo {where} holds several .safetensors files ({', '.join(repr(c) for c in candidates)}) and "
            f"none is named {PREFERRED_WEIGHT_NAME!r}; pass weight_name to pick one",
            candidates,
        )
    pickles = [f for f in files if f.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise PickleOnlyError(
            f"LoRA repo {where} holds only pickle weights ({', '.join(repr(p) for p in pickles)}); only "
            ".safetensors files are accepted, pickles are never unpickled"
        )
    raise NoSafetensorsError(f"LoRA repo {where} holds no .safetensors file; accepted: a repo with a .safetensors LoRA")


def weight_candidates(files: Iterable[str]) -> tuple[str, ...]:
    """The files that could be a repo's LoRA: its `.safetensors` files but embeddings files."""
    return tuple(f for f in files if _is_weight_candidate(f))


def _is_weight_candidate(name: str) -> bool:
    return name.lower().endswith(".safetensors") and not is_embeddings_file(name)
