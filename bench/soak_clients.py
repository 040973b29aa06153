"""`bench.soak`'s clients, in a process of their own (so the server's threads are counted alone).

    python -m bench.soak_clients CONFIG.json RESULT.json

Each client thread draws, until the deadline, one of: `POST /` (now and then to `/models/<SD 1.5>`; some hang up
early), `gradio_client` `/generate` and `/compare` (some cancelled with `job.cancel()`), a client that joins
`/generate` or `/compare` by Gradio's queue protocol and leaves while queued (its event stream closed), a
gallery click's prefetch (some left early), and a request from an image (image-to-image or inpainting, through
`POST /` as base64 or a raw body, or `gradio_client` `/generate`), each kind of image through each of them in turn
(`IMAGE_TURNS`): a good one, a bad one (no image, cut off, a GIF), and the oversized one (12000 x 12000 pixels; not
in the warm-up); a video, or an edit from several references (`bench.soak_media`). A burst thread fills the queue
at the configured moments. LoRAs are drawn from every role (`bench.soak_service`). Every answer is classified by
the status (or, through Gradio, the title) its error of the tree carries: `ok`, `refused` (4xx; 503 for a full
queue or the Hub unreachable), or `errors_5xx` (any other 5xx, an unexpected exception or a dropped connection). A
bad or oversized image, or an over-count edit, answered with an image is also counted (`bad_images_accepted`,
`oversized_accepted`, `over_count_accepted`, and by transport in `accepted_by`). Clients download nothing
(`download_files=False`): the server's temp folder is measured alone. Each request that left on purpose is
`cancelled`, and those with a seed are listed (`departures`)
for the server side to look for ghosts.
"""

from __future__ import annotations

import base64
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from bench.soak_media import MediaRequests
from lora_catalog.errors import SwitchboardError

__all__ = ["main"]

# 503s the soak provokes on purpose: a full queue, the Hub down or cutting downloads.
EXPECTED_503 = {"EngineBusyError", "HubUnavailableError"}
_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
# The longest any one request may take before the soak calls it a hang (a 5xx): a burst's 30 steps behind a full
# queue of them take well under a minute on 2 cores.
_ANSWER_S = 180.0
_STEPS = (2, 3, 4)
# The image requests' (kind, transport), taken in turn: the oversized image through every transport first.
IMAGE_TURNS = (
    ("oversized", "gradio_client"),
    ("oversized", "POST /"),
    ("oversized", "POST / raw"),
    ("bad", "gradio_client"),
    ("good", "gradio_client"),
    ("bad", "POST /"),
    ("good", "POST /"),
    ("bad", "POST / raw"),
    ("good", "POST / raw"),
)
# What a refused image's kind counts toward when it is answered with an image.
ACCEPTED = {"bad": "bad_images_accepted", "oversized": "oversized_accepted", "over_count": "over_count_accepted"}


def _titles() -> dict[str, int]:
    """Each title of the error tree and the highest status a class with that title answers with."""
    found: dict[str, int] = {}
    pending: list[type[SwitchboardError]] = [SwitchboardError]
    import engine.errors  # noqa: F401  (the engine's classes join the tree)

    while pending:
        cls = pending.pop()
        found[cls.title] = max(found.get(cls.title, 0), cls.status)
        pending.extend(cls.__subclasses__())
    return found


TITLES = _titles()
EXPECTED_TITLES = {"Busy", "Hub unreachable"}


class Tally:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.departures: list[tuple[int, float, str]] = []
        self.problems: list[str] = []
        self.accepted_by: Counter[str] = Counter()
        self.sent_by: Counter[str] = Counter()

    def add(self, outcome: str, detail: str = "") -> None:
        with self._lock:
            self.counts["requests"] += 1
            self.counts[outcome] += 1
            if outcome == "errors_5xx" and len(self.problems) < 20:
                self.problems.append(detail[:300])

    def image(self, kind: str, transport: str, outcome: tuple[str, str]) -> None:
        """An image request's answer; a bad or oversized image, or an over-count edit, answered with an image is
        counted by transport."""
        self.add(*outcome)
        with self._lock:
            self.sent_by[f"{kind} through {transport}"] += 1
        if kind in ACCEPTED and outcome[0] == "ok":
            with self._lock:
                self.counts[ACCEPTED[kind]] += 1
                self.accepted_by[f"{kind} through {transport}"] += 1

    def note(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def left(self, seed: int | None, how: str) -> None:
        with self._lock:
            self.counts["requests"] += 1
            self.counts["cancelled"] += 1
            if seed is not None:
                self.departures.append((seed, time.time(), how))


def classify_http(response: httpx.Response) -> tuple[str, str]:
    if response.status_code == 200:
        return "ok", ""
    try:
        kind = str(response.json().get("error_type", ""))
    except ValueError:
        return "errors_5xx", f"HTTP {response.status_code} not JSON: {response.text[:200]}"
    if response.status_code < 500 or (response.status_code == 503 and kind in EXPECTED_503):
        return "refused", kind
    return "errors_5xx", f"HTTP {response.status_code} {kind}: {response.text[:200]}"


def classify_title(title: str, message: str) -> tuple[str, str]:
    status = TITLES.get(title, 500)
    if status < 500 or title in EXPECTED_TITLES:
        return "refused", title
    return "errors_5xx", f"{title}: {message}"


class Soak(MediaRequests):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.url: str = config["url"]
        self.deadline = time.monotonic() + float(config["duration_s"])
        self.loras: dict[str, list[str]] = config["loras"]
        self.fns: dict[str, dict[str, Any]] = config["fns"]
        self.images: dict[str, Any] = config["images"]
        self._turn_lock = threading.Lock()
        self._turn = 0
        self._edit_turn = 0  # `MediaRequests.edit_turn`'s
        self.tally = Tally()

    # -- what a client asks for -------------------------------------------------------------------------------

    def lora(self, rng: random.Random) -> str:
        roles = ["", "good", "sd15", "flux", "slow", "cut", "refused"]
        role = rng.choices(roles, weights=[2, 5, 1, 1.5, 1.5, 1, 1.5])[0]
        return rng.choice(self.loras[role]) if role else ""

    def image_turn(self) -> tuple[str, str]:
        """The next (kind, transport) of `IMAGE_TURNS`, in turn across the clients, so that even a short run sends
        each; the oversized image only where the run asks for it (not in the warm-up, before idle memory is read)."""
        with self._turn_lock:
            while True:
                kind, transport = IMAGE_TURNS[self._turn % len(IMAGE_TURNS)]
                self._turn += 1
                if kind != "oversized" or self.config.get("oversized", True):
                    return kind, transport

    def from_image(self, rng: random.Random, client: Client, seed: int) -> None:
        """Image-to-image or inpainting (a mask, of the image's size or another, half of the time), through
        `gradio_client` `/generate` or `POST /` (base64 in JSON, or the image as the raw body)."""
        kind, transport = self.image_turn()
        image = {"good": self.images["image"], "oversized": self.images["oversized"]}.get(kind)
        image = image or rng.choice(self.images["bad"])
        mask = rng.choice([None, None, self.images["mask"], self.images["mask_other"]]) if kind == "good" else None
        mask = None if transport == "POST / raw" else mask
        lora, strength = self.lora(rng), round(rng.uniform(0.3, 0.9), 2)
        if transport == "gradio_client":
            job = client.submit(
                prompt="a soak fox",
                negative_prompt="",
                lora=lora,
                lora_scale=1.0,
                lora_2="",
                lora_2_scale=1.0,
                steps=rng.choice(_STEPS),
                guidance=5.0,
                width=64,
                height=64,
                seed=seed,
                image=handle_file(image),
                mask=handle_file(mask) if mask else None,
                strength=strength,
                api_name="/generate",
            )
            self.tally.image(kind, transport, self._answer(job, "/generate from an image"))
            return
        headers = {"accept": "image/png", **({"lora": lora} if lora else {})}
        data = Path(image).read_bytes()
        if transport == "POST / raw":  # the image as the body: Hugging Face's raw image-to-image form
            response = httpx.post(
                self.url, content=data, headers={**headers, "content-type": "image/png"}, timeout=_TIMEOUT
            )
        else:
            parameters: dict[str, Any] = {"prompt": "a soak fox", "strength": strength, "seed": seed}
            parameters["num_inference_steps"] = rng.choice(_STEPS)
            if mask:
                parameters["mask_image"] = base64.b64encode(Path(mask).read_bytes()).decode()
            body = {"inputs": base64.b64encode(data).decode(), "parameters": parameters}
            response = httpx.post(self.url, json=body, headers=headers, timeout=_TIMEOUT)
        self.tally.image(kind, transport, classify_http(response))

    def http(self, rng: random.Random, seed: int) -> None:
        lora, path = self.lora(rng), ""
        if not lora and rng.random() < 0.3:
            path = f"models/{self.config['sd15_base']}"
        body = {"inputs": "a soak fox", "parameters": {"num_inference_steps": rng.choice(_STEPS), "seed": seed}}
        headers = {"accept": "image/png", **({"lora": lora} if lora else {})}
        leaves = rng.random() < 0.15
        timeout = httpx.Timeout(rng.uniform(0.2, 1.5), connect=10.0) if leaves else _TIMEOUT
        try:
            response = httpx.post(self.url + path, json=body, headers=headers, timeout=timeout)
        except httpx.ReadTimeout:
            self.tally.left(seed, "POST / hung up")  # the server must cancel it
            return
        self.tally.add(*classify_http(response))

    def generate(self, rng: random.Random, client: Client, seed: int) -> None:
        arguments = {
            "prompt": "a soak fox",
            "negative_prompt": "",
            "lora": self.lora(rng),
            "lora_scale": 1.0,
            "lora_2": "",
            "lora_2_scale": 1.0,
            "steps": rng.choice(_STEPS),
            "guidance": 5.0,
            "width": 64,
            "height": 64,
            "seed": seed,
        }
        self._job(rng, client.submit(**arguments, api_name="/generate"), seed, "/generate job.cancel()")

    def compare(self, rng: random.Random, client: Client, seed: int) -> None:
        picked = rng.sample(self.loras["good"] + self.loras["slow"], 2)
        sweep = rng.random() < 0.3
        arguments = {
            "prompt": "a soak fox",
            "negative_prompt": "",
            "loras": picked[0] if sweep else ",".join(picked),
            "scales": "0, 0.5, 1" if sweep else "",
            "include_base": not sweep,
            "steps": 2,
            "guidance": 5.0,
            "width": 64,
            "height": 64,
            "seed": seed,
        }
        self._job(rng, client.submit(**arguments, api_name="/compare"), seed, "/compare job.cancel()")

    def _job(self, rng: random.Random, job: Any, seed: int, how: str) -> None:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.1, 1.5))
            if not job.done():
                job.cancel()
                self.tally.left(seed, how)
                return
        self.tally.add(*self._answer(job, how))

    _classified = staticmethod(classify_http)

    @staticmethod
    def _answer(job: Any, how: str) -> tuple[str, str]:
        """A `gradio_client` job's outcome, once it is answered."""
        try:
            job.result(timeout=_ANSWER_S)
        except TimeoutError:
            return "errors_5xx", f"{how.split()[0]}: no answer within {_ANSWER_S:.0f} s"
        except AppError as e:
            return classify_title(e.title, e.message)
        except Exception as e:
            return "errors_5xx", f"{type(e).__name__}: {e}"
        return "ok", ""

    def leave(self, rng: random.Random, seed: int) -> None:
        """Join `/generate` or `/compare` by Gradio's protocol, then close the event stream while it waits."""
        name = rng.choice(["generate_api", "compare_api"])
        fn = self.fns[name]
        data = list(fn["data"])
        data[0] = "a soak fox"
        if name == "generate_api":
            data[2], data[10] = self.lora(rng), seed
        else:
            data[2], data[4], data[9] = ",".join(rng.sample(self.loras["good"], 2)), True, seed
        outcome = self._join(fn, [data], stay_s=rng.uniform(0.05, 1.0))
        if outcome[0] == "cancelled":
            self.tally.left(seed, f"{name} left")
        else:  # it was answered before the client could leave
            self.tally.add(*outcome)

    def prefetch(self, rng: random.Random) -> None:
        """A gallery click: its LoRA prepared ahead. Now and then a second pick for the same slot follows at once
        (which drops the first), or the page is left before the answer (its event stream closed)."""
        fn = self.fns["prefetch"]
        picks = [self.lora(rng) or self.loras["good"][0] for _ in range(2 if rng.random() < 0.4 else 1)]
        stay_s = rng.uniform(0.05, 0.5) if rng.random() < 0.3 else None
        outcome = self._join(fn, [["LoRA 1", lora, "", "", "", "", ""] for lora in picks], stay_s=stay_s)
        if outcome[0] == "cancelled":
            self.tally.left(None, "prefetch left")
        else:
            self.tally.add(*outcome)

    def _join(self, fn: dict[str, Any], events: list[list[Any]], *, stay_s: float | None) -> tuple[str, str]:
        """Join `events` (each a call's data) in one new session, as a page does, and read its event stream until
        every one is answered (the worst outcome), or leave after `stay_s` ("cancelled")."""
        session = uuid.uuid4().hex
        for data in events:
            body = {"data": data, "fn_index": fn["fn_index"], "session_hash": session, "trigger_id": fn["trigger_id"]}
            joined = httpx.post(f"{self.url}gradio_api/queue/join", json=body, timeout=_TIMEOUT)
            if joined.status_code != 200:
                return "errors_5xx", f"queue/join answered {joined.status_code}: {joined.text[:200]}"
        started = time.monotonic()
        # Gradio sends a heartbeat at least every 15 s while an event is pending: silence past 30 s is a hang.
        timeout = httpx.Timeout(30.0 if stay_s is None else stay_s, connect=10.0)
        params = {"session_hash": session}
        try:
            with httpx.stream("GET", f"{self.url}gradio_api/queue/data", params=params, timeout=timeout) as stream:
                return self._answers(stream, len(events), started, stay_s)
        except httpx.ReadTimeout:
            if stay_s is None:
                return "errors_5xx", "the event stream fell silent for 30 s before every answer came"
            return "cancelled", ""  # nothing came for `stay_s`: the client leaves, closing the stream

    @staticmethod
    def _answers(stream: httpx.Response, expected: int, started: float, stay_s: float | None) -> tuple[str, str]:
        worst: tuple[str, str] = ("ok", "")
        for line in stream.iter_lines():
            if stay_s is not None and time.monotonic() - started > stay_s:
                return "cancelled", ""
            if time.monotonic() - started > _ANSWER_S:
                return "errors_5xx", f"no answer within {_ANSWER_S:.0f} s (the stream stayed open)"
            if '"msg":"process_completed"' not in line:
                continue
            message = json.loads(line.removeprefix("data:").strip())
            if not message.get("success"):
                output = message.get("output") or {}
                found = classify_title(str(output.get("title", "Error")), str(output.get("error")))
                worst = found if found[0] == "errors_5xx" or worst[0] == "ok" else worst
            expected -= 1
            if expected == 0:
                return worst
        return "errors_5xx", "the event stream ended before every answer came"

    # -- the clients ------------------------------------------------------------------------------------------

    def client(self, number: int) -> None:
        rng = random.Random(self.config["seed"] * 1000 + number)
        # Nothing downloaded: the server's temp folder is measured alone (gradio_client's default download folder is
        # Gradio's temp folder, the server's too on one machine).
        client = Client(self.url, verbose=False, download_files=False)
        actions: dict[str, Callable[[int], None]] = {
            "http": lambda seed: self.http(rng, seed),
            "generate": lambda seed: self.generate(rng, client, seed),
            "compare": lambda seed: self.compare(rng, client, seed),
            "leave": lambda seed: self.leave(rng, seed),
            "prefetch": lambda seed: self.prefetch(rng),
            "image": lambda seed: self.from_image(rng, client, seed),
            "video": lambda seed: self.video(rng, client, seed),
            "edit": lambda seed: self.edit(client, seed),
        }
        turn = 0
        try:
            while time.monotonic() < self.deadline:
                turn += 1
                action = rng.choices(list(actions), weights=[30, 18, 9, 9, 20, 14, 8, 8])[0]
                # Unique over both runs (`seed_base` differs), so a departure names one request.
                seed = int(self.config["seed_base"]) + (number + 1) * 1_000_000 + turn
                try:
                    actions[action](seed)
                except Exception as e:  # a dropped connection, a protocol surprise: the soak's problem to report
                    self.tally.add("errors_5xx", f"{action}: {type(e).__name__}: {e}")
                time.sleep(rng.uniform(0.0, 0.3))
        finally:
            client.close()

    def burst(self, at_s: float) -> None:
        """Three queues' worth of slow requests at once: the queue fills, the rest are told it is busy."""
        time.sleep(max(0.0, at_s))
        size = 3 * int(self.config["max_queue"])
        body = {"inputs": "a soak fox", "parameters": {"num_inference_steps": 30, "seed": 99}}

        def one() -> None:
            try:
                response = httpx.post(self.url, json=body, headers={"accept": "image/png"}, timeout=_TIMEOUT)
            except Exception as e:
                self.tally.add("errors_5xx", f"burst: {type(e).__name__}: {e}")
                return
            outcome = classify_http(response)
            if outcome[1] == "EngineBusyError":
                self.tally.note("busy")
            self.tally.add(*outcome)

        threads = [threading.Thread(target=one) for _ in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def run(self) -> dict[str, Any]:
        duration = float(self.config["duration_s"])
        threads = [
            threading.Thread(target=self.client, args=(n,), name=f"client {n}", daemon=True)
            for n in range(int(self.config["clients"]))
        ]
        threads += [
            threading.Thread(target=self.burst, args=(f * duration,), name=f"burst at {f:.0%}", daemon=True)
            for f in self.config["bursts"]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=max(0.0, self.deadline - time.monotonic()) + 2 * _ANSWER_S)
        stuck = [t.name for t in threads if t.is_alive()]
        for name in stuck:
            self.tally.add("errors_5xx", f"{name} was still waiting for an answer at the end")
        return {
            **self.tally.counts,
            "departures": self.tally.departures,
            "problems": self.tally.problems,
            "accepted_by": dict(self.tally.accepted_by),
            "sent_by": dict(self.tally.sent_by),
        }


def main(argv: list[str] | None = None) -> int:
    # `kill -USR1 <pid>` prints every thread's stack: what a hang is waiting for.
    faulthandler.register(signal.SIGUSR1)
    config_path, result_path = (argv or sys.argv[1:])[:2]
    result = Soak(json.loads(Path(config_path).read_text())).run()
    Path(result_path).write_text(json.dumps(result))
    # Ended here, not by returning: after some `job.cancel()`s gradio_client (2.7) keeps its session's event
    # stream open (the server answers it with heartbeats: Gradio's own queue is empty by then) on a non-daemon
    # executor thread that `Client.close()` leaves running, and the interpreter would wait for it forever.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
