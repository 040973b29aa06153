"""A video LoRA's preview videos in the catalogue: Wan LoRAs listed per base carry their card's MP4s
(`LoraEntry.preview_videos`; its stills stay in `preview_urls`), under the image rule: a path in the repo or a
file URL on the Hub's own host, shown through its resolve URL, never a URL elsewhere, another video type, or a
repo path with a query or fragment. Against a stand-in Hub, and the card rule alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from families.wan import MODEL_ID as WAN21
from families.wan22 import MODEL_ID as WAN22
from lora_catalog import Family, HubSource
from lora_catalog.cards import entry_from_hub_item
from lora_catalog.entries import LoraEntry
from tests.support.standin_hub import StandInHub

NS = "video-hub"
ENDPOINT = "https://hub.example"


def card(base: str, **fields: object) -> bytes:
    data = {"tags": ["lora", "text-to-video"], "base_model": base, **fields}
    return f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n# A Wan LoRA\n".encode()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    with StandInHub(tmp_path_factory.mktemp("video-hub")) as started:
        widget = [
            {"text": "a fox running", "output": {"url": "videos/fox.mp4"}},
            {"text": "a fox, still", "output": {"url": "images/fox.png"}},
            {"text": "elsewhere", "output": {"url": "https://cdn.example/fox.mp4"}},
        ]
        started.add_repo(
            f"{NS}/fox-wan21",
            {"README.md": card(WAN21, widget=widget), "fox.safetensors": b"x", "videos/fox.mp4": b"mp4"},
            downloads=30,
        )
        # No widget: the repo's own MP4 is its preview video, and it has no still.
        started.add_repo(
            f"{NS}/motion-wan22",
            {"README.md": card(WAN22), "motion.safetensors": b"x", "sample.mp4": b"mp4", "clip.webm": b"webm"},
            downloads=20,
        )
        yield started


def test_wan_loras_are_listed_per_base_with_their_preview_videos(hub: StandInHub) -> None:
    source = HubSource(endpoint=hub.url, timeout_s=5.0)
    (fox,) = source.list_loras(WAN21, limit=10)
    assert fox.family is Family.WAN and fox.repo_id == f"{NS}/fox-wan21"
    assert fox.preview_videos == (hub.file_url(fox.repo_id, "videos/fox.mp4", fox.sha or ""),)
    assert fox.preview_urls == (hub.file_url(fox.repo_id, "images/fox.png", fox.sha or ""),)
    (motion,) = source.list_loras(WAN22, limit=10)
    assert motion.family is Family.WAN22
    assert motion.preview_videos == (hub.file_url(motion.repo_id or "", "sample.mp4", motion.sha or ""),)
    assert motion.preview_urls == ()
    # A snapshot keeps them.
    assert LoraEntry.from_json(fox.to_json()).preview_videos == fox.preview_videos


def _videos(*urls: str) -> tuple[str, ...]:
    item = {"id": "o/p", "sha": "b" * 40, "cardData": {"widget": [{"output": {"url": u}} for u in urls]}}
    return entry_from_hub_item(item, endpoint=ENDPOINT).preview_videos


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("videos/a.mp4", f"{ENDPOINT}/o/p/resolve/{'b' * 40}/videos/a.mp4"),
        ("./A.MP4", f"{ENDPOINT}/o/p/resolve/{'b' * 40}/A.MP4"),
        # A Hub file URL's query is not carried: the URL shown is rebuilt from the file's path.
        (f"{ENDPOINT}/o/q/blob/main/v/a.mp4?download=true", f"{ENDPOINT}/o/q/resolve/main/v/a.mp4"),
    ],
)
def test_a_cards_mp4_in_the_repo_or_on_the_hub_is_shown_through_its_resolve_url(url: str, shown: str) -> None:
    assert _videos(url) == (shown,)


@pytest.mark.parametrize(
    "url",
    [
        "https://cdn.example/a.mp4",
        "//cdn.example/a.mp4",
        "https://hub.example.attacker.example/o/p/resolve/main/a.mp4",
        "https://hub.example/o/p/resolve/main/../../a.mp4",
        "videos/a.mp4?x=1",
        "videos/a.svg?.mp4",
        "videos/a.mp4#t=2",
        "videos/a.webm",
        "videos/a.mov",
        "images/a.png",
        "data:video/mp4;base64,AAAA",
    ],
)
def test_a_video_anywhere_else_or_of_another_kind_is_not_shown(url: str) -> None:
    assert _videos(url) == ()


def test_an_image_path_with_a_query_or_fragment_is_refused_like_civitais() -> None:
    item = {"id": "o/p", "sha": "b" * 40, "cardData": {"widget": [{"output": {"url": "a.svg?.png"}}]}}
    assert entry_from_hub_item(item, endpoint=ENDPOINT).preview_urls == ()
