"""The parsers and checks behind `engine.settings.Settings`'s fields: byte sizes, booleans, devices, model ids,
folders, URLs, host lists. Each refusal is a `Refused` naming what is wrong and what is accepted, which
`engine.settings` turns into one SettingsError naming the variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationInfo

from engine.models import HUB_ID

BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
FROM_ENV = "from_env"  # validation context: the values come from the environment


class Refused(ValueError):
    """A value one of the validators below refuses: what is wrong with it, and what is accepted."""

    def __init__(self, problem: str, accepted: str) -> None:
        super().__init__(f"{problem}; accepted: {accepted}")
        self.problem, self.accepted = problem, accepted


def strip(value: object) -> object:
    return value.strip() if isinstance(value, str) else value


def lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def upper(value: object) -> object:
    return value.strip().upper() if isinstance(value, str) else value


def bytes_of(text: str) -> int:
    """`4GiB`, `512MB` or `1048576` as bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in UNITS:
        units = ", ".join(u for u in UNITS if u)
        raise Refused("is not a byte size", f"a number with an optional unit ({units}), e.g. 4GiB")
    return int(float(match.group(1)) * UNITS[unit])


def byte_size(value: object) -> object:
    return bytes_of(value) if isinstance(value, str) else value


def auto_none(value: object) -> object:
    return None if isinstance(value, str) and value.strip().lower() == "auto" else value


def at_least_one_byte(value: int) -> int:
    if value < 1:
        raise Refused("is not accepted", "a byte size of at least 1 byte, e.g. 2GiB")
    return value


def boolean(value: object) -> object:
    if not isinstance(value, str):
        return value
    if value.strip().lower() not in BOOLS:
        raise Refused("is not accepted", ", ".join(BOOLS))
    return BOOLS[value.strip().lower()]


def device(value: str) -> str:
    if value in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise Refused("is not accepted", "auto, cpu, cuda, cuda:<index>, mps")


def model_id(value: str) -> str:
    if not value:
        raise Refused("is empty", "a Hub repo id, a local diffusers folder or 'tiny'")
    return value


def hub_id(value: str) -> str:
    if not HUB_ID.match(value):
        raise Refused("is not a Hub repo id", "'owner/name'")
    return value


def preview_vae(value: str, info: ValidationInfo) -> str:
    if value in ("auto", "none") or HUB_ID.match(value) or not from_env(info):
        return value
    folder = Path(value).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    raise Refused(
        "is not accepted", "auto, none, a Hub repo id (owner/name) or an existing folder holding an AutoencoderTiny"
    )


def folder(value: Path | None, info: ValidationInfo) -> Path | None:
    if value is None or not from_env(info):
        return value
    path = value.expanduser().resolve()
    if not path.is_dir():
        raise Refused("is not an existing folder", "a path to a folder")
    return path


def url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise Refused("is not accepted", "an http(s) URL with a host and no query, e.g. http://head-node:8000")
    try:
        parts.port  # noqa: B018 -- urlsplit checks the port only when it is read
    except ValueError as e:
        raise Refused("has a bad port", "a port from 0 to 65535") from e
    return value.rstrip("/")


def names(value: object) -> object:
    """A comma-separated list (`a, b`) as a tuple of its non-empty items."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def integer(value: object) -> object:
    """A whole number written as text (`64`) as an int, for a setting whose accepted values are numbers."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def nsfw_level(value: object) -> object:
    return value.strip().upper().replace("-", "") if isinstance(value, str) else value


def hosts(value: object) -> object:
    """`a.example, *.example.org` as a tuple of lower-cased host names (`*.` allows the sub-domains)."""
    if not isinstance(value, str):
        return value
    hosts = tuple(h.strip().lower().rstrip(".") for h in value.split(",") if h.strip())
    for host in hosts:
        if not re.fullmatch(r"(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", host):
            raise Refused(
                f"holds {host!r}, not a host name", "comma-separated host names, '*.<domain>' for its sub-domains"
            )
    return hosts


def from_env(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and bool(info.context.get(FROM_ENV))
