"""`bench.soak`'s requests for the media pools (`bench.soak_clients` mixes them in): a video on the tiny Wan pool
(`POST /models/<Wan>`, an MP4 or an animated WebP by Accept, or `gradio_client` `/generate_video`), and an edit from
several references on the tiny FLUX.2 [klein] pool (`gradio_client` `/generate` with `image` and `images`, or
`POST /models/<klein>` with `parameters.images`), each kind of edit through each transport in turn (`EDIT_TURNS`):
a good one (two images), an over-count one (60 solid 2656 x 2656 WebP references of 340 bytes each, against the
pool's 4 images) and one whose reference's header says 12000 x 12000 (neither refused kind in the warm-up). The
refused kinds must be refused (4xx), never answered with an image; a video answered as anything but the type asked
for is a 5xx.
"""

from __future__ import annotations

import base64
import random
import threading
from pathlib import Path
from typing import Any

import httpx
from gradio_client import Client, handle_file

__all__ = ["EDIT_TURNS", "MediaRequests"]

# The reference edits' (kind, transport), taken in turn: an over-count and an oversized reference through each
# transport first (a short run sends each), then good ones.
EDIT_TURNS = (
    ("over_count", "POST / (references)"),
    ("over_count", "gradio_client (references)"),
    ("oversized", "POST / (references)"),
    ("oversized", "gradio_client (references)"),
    ("good", "gradio_client (references)"),
    ("good", "POST / (references)"),
)
VIDEO_TYPES = ("video/mp4", "image/webp")
_PROMPT = "the fox of image 1 in the style of image 2"
_TIMEOUT = httpx.Timeout(120.0, connect=10.0)


class MediaRequests:
    """The video and edit requests of a `bench.soak_clients.Soak` (its config, images, tally and turn)."""

    config: dict[str, Any]
    url: str
    images: dict[str, Any]
    tally: Any  # bench.soak_clients.Tally
    _turn_lock: threading.Lock
    _edit_turn: int

    def _answer(self, job: Any, how: str) -> tuple[str, str]:
        """A `gradio_client` job's outcome (the soak's own)."""
        raise NotImplementedError

    def _classified(self, response: httpx.Response) -> tuple[str, str]:
        """An HTTP answer's outcome (the soak's own)."""
        raise NotImplementedError

    def edit_turn(self) -> tuple[str, str]:
        """The next (kind, transport) of `EDIT_TURNS`; the refused kinds only where the run asks for them."""
        with self._turn_lock:
            while True:
                kind, transport = EDIT_TURNS[self._edit_turn % len(EDIT_TURNS)]
                self._edit_turn += 1
                if kind == "good" or self.config.get("oversized", True):
                    return kind, transport

    def edit(self, client: Client, seed: int) -> None:
        """An edit from several references on the klein pool: image 1 and the turn's references, through
        `gradio_client` `/generate` (`image`, `images`) or `POST /models/<klein>` (`parameters.images`, base64)."""
        kind, transport = self.edit_turn()
        references = {
            "good": [self.images["reference"]],
            "over_count": [self.images["solid"]] * int(self.config["over_count"]),
            "oversized": [self.images["oversized"]],
        }[kind]
        base = self.config["klein_base"]
        if transport.startswith("gradio_client"):
            job = client.submit(
                prompt=_PROMPT,
                steps=2,
                width=64,
                height=64,
                seed=seed,
                base=base,
                image=handle_file(self.images["image"]),
                images=[handle_file(path) for path in references],
                api_name="/generate",
            )
            self.tally.image(kind, transport, self._answer(job, "/generate with references"))
            return
        parameters = {
            "prompt": _PROMPT,
            "num_inference_steps": 2,
            "seed": seed,
            "images": [base64.b64encode(Path(path).read_bytes()).decode() for path in references],
        }
        body = {"inputs": base64.b64encode(Path(self.images["image"]).read_bytes()).decode(), "parameters": parameters}
        response = httpx.post(f"{self.url}models/{base}", json=body, headers={"accept": "image/png"}, timeout=_TIMEOUT)
        self.tally.image(kind, transport, self._classified(response))

    def video(self, rng: random.Random, client: Client, seed: int) -> None:
        """A video on the Wan pool: `POST /models/<Wan>` (an MP4, or an animated WebP by Accept), or
        `gradio_client` `/generate_video`."""
        base = self.config["wan_base"]
        self.tally.note("videos_sent")
        if rng.random() < 0.4:
            job = client.submit(prompt="a soak fox running", steps=2, seed=seed, base=base, api_name="/generate_video")
            outcome = self._answer(job, "/generate_video")
        else:
            accept = rng.choice(VIDEO_TYPES)
            body = {"inputs": "a soak fox running", "parameters": {"num_inference_steps": 2, "seed": seed}}
            response = httpx.post(f"{self.url}models/{base}", json=body, headers={"accept": accept}, timeout=_TIMEOUT)
            outcome = self._classified(response)
            answered = response.headers.get("content-type", "")
            if outcome[0] == "ok" and answered != accept:
                outcome = ("errors_5xx", f"a video asked for as {accept} was answered as {answered!r}")
        if outcome[0] == "ok":
            self.tally.note("videos_answered")
        self.tally.add(*outcome)
