"""`python -m bench.soak`: the launched service under a long mixed load with faults, checked for what must not drift.

The service is the real app (UI, named API and `POST /`) over five tiny pools on CPU (SDXL; SD 1.5 and FLUX.1 in
bf16, FLUX.1's denoiser in fp8 and LoRAs as branches; Wan 2.1 for videos; FLUX.2 [klein] for edits from several
references), with small budgets (`bench.soak_service.soak_settings`) and its LoRAs on the stand-in Hub. The
clients run in a process of their own (`bench.soak_clients`): `POST /`, `gradio_client` `/generate` and
`/compare`, clients that leave while queued, gallery-click prefetches; image-to-image and inpainting through
`POST /` and `gradio_client`, with bad images and a 12000 x 12000 PNG among them; videos on the Wan pool and edits
from several references on the klein pool, with over-count bodies (60 references) and a reference whose header
says 12000 x 12000 among them (`bench.soak_media`); random hang-ups and `job.cancel()`s; LoRAs that are slow to
download, cut off mid-download, or refused; and bursts that fill the queue. The Hub's faults come from here, on a
timeline over `--duration-s`: downloads of the `cut` LoRAs cut off from 25 % to 35 % and from 75 % to 85 %, and
the whole Hub down from 45 % to 60 % (an outage in the middle). A warm-up run of every kind of request comes
first (`--warmup-s`), after which the server's threads are counted.

Measured at the end, once the clients are done and the queues have drained:

- `ghosts`: requests that reached the GPU more than `GRACE_S` after their client left (a ghost run), plus
  requests still queued or prefetches still waiting once every client is gone;
- `leaked_threads`: the server's threads beyond those after the warm-up (idle pools given a minute to shrink,
  anyio's idle workers let go); the schedulers' bounded preparation threads, and the event loop's default
  executor's (`asyncio.to_thread`: at most `min(32, CPUs + 4)`, kept once started), counted against their bounds
  instead, and the single-thread pools started on demand (each pool's GPU thread, the catalogue's revalidation) at one
  thread of each name;
- `disk_over_budget_bytes`: LoRA bytes in the Hub cache over `DISK_CACHE_BYTES` once pruning is idle;
- `host_over_budget_bytes`: the most any pool's prepared adapters held over `HOST_CACHE_BYTES`, or all pools'
  adapters and pristine copies in host RAM together held over `HOST_RAM_BYTES`, sampled every 0.25 s through
  the run;
- `bad_images_accepted`, `oversized_accepted`, `over_count_accepted`: requests whose image (or reference) was no
  image, cut off, a GIF, or the oversized one, or an edit with more references than the pool takes, answered with
  an image rather than refused (each transport's count is printed);
- `peak_rss_over_idle_bytes`: the server process's peak resident memory through the run (the kernel's high-water
  mark, reset once idle after the warm-up; else sampled every 0.25 s) over its resident memory then;
- `gradio_tmp_bytes`: the size of Gradio's temp folder (`GRADIO_TEMP_DIR`, the soak's own) at the end, once the
  queues have drained: the results and uploads of the last `TEMP_FILES_MAX_AGE_S` (60 s), what Gradio keeps for good
  (the UI's example image), and whatever it fails to clean (the clients download nothing there);
- `base_exact`: every weight and buffer of every pool byte-identical with what was loaded (the fp8 values and
  row scales too), and every LoRA branch of the quantized pool zero, after the pools put the base back.

The last line: `soak: requests= ok= refused= errors_5xx= ghosts= leaked_threads= disk_over_budget_bytes=
host_over_budget_bytes= bad_images_accepted= oversized_accepted= over_count_accepted= peak_rss_over_idle_bytes=
gradio_tmp_bytes= base_exact=`; `errors_5xx`, `ghosts`, `leaked_threads`, both over-budget figures and the three
image figures must be 0 and `base_exact` true (the exit status is 1 otherwise); the peak RSS and the temp folder's
size are reported, not judged. `refused` counts 4xx
answers and the 503s the soak provokes (a full queue, the Hub unreachable); requests cancelled on purpose count in
`requests` only.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["GRACE_S", "PROBLEMS", "Options", "folder_bytes", "main", "rss_bytes"]

# Gradio notices a closed event stream within about 10 s (its read timeout); the handlers ask every 0.5 s.
GRACE_S = 20.0
_DRAIN_S = 120.0
_SETTLE_S = 60.0
_PREPARE = re.compile(r"^prepare_\d+$")
# The event loop's default executor (`asyncio.to_thread`): its threads stay once started, up to Python's bound.
_ASYNCIO = re.compile(r"^asyncio_\d+$")
ASYNCIO_BOUND = min(32, (os.cpu_count() or 1) + 4)
# Single-thread pools started on demand, one per object that owns one: a second thread of a name is a leak.
_SINGLE = re.compile(r"^(gpu-\d+|hub-revalidate|lora-catalog|.+-swr)_\d+$")
# The figures that must be 0.
PROBLEMS = (
    "errors_5xx",
    "ghosts",
    "leaked_threads",
    "disk_over_budget_bytes",
    "host_over_budget_bytes",
    "bad_images_accepted",
    "oversized_accepted",
    "over_count_accepted",
)


@dataclass(frozen=True)
class Options:
    duration_s: float
    warmup_s: float
    clients: int
    max_queue: int
    seed: int
    json_path: Path | None


def parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="how long the mixed load runs (600)")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="the warm-up run before threads are counted")
    parser.add_argument("--clients", type=int, default=6, help="client threads (6)")
    parser.add_argument("--max-queue", type=int, default=4, help="MAX_QUEUE of each pool (4: bursts fill it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write every figure (and the clients' problems)")
    a = parser.parse_args(argv)
    if a.duration_s <= 0 or a.warmup_s < 0 or a.clients < 1 or a.max_queue < 1:
        parser.error("accepted: --duration-s > 0, --warmup-s >= 0, --clients >= 1, --max-queue >= 1")
    return Options(a.duration_s, a.warmup_s, a.clients, a.max_queue, a.seed, a.json)


def _environment(root: Path) -> int:
    """Point huggingface_hub at a stand-in Hub before anything imports it; returns the Hub's port."""
    from tests.support.app_server import free_port

    port = free_port()
    os.environ.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HOME=str(root / "hf-home"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        # Slow downloads take 2.5 s; a cut one must fail, not hang.
        HF_HUB_DOWNLOAD_TIMEOUT="10",
        HF_HUB_ETAG_TIMEOUT="5",
        GRADIO_ANALYTICS_ENABLED="False",
        # Gradio's files in a folder of the soak's own, measured at the end (`gradio_tmp_bytes`).
        GRADIO_TEMP_DIR=str(root / "gradio-tmp"),
    )
    return port


class Faults(threading.Thread):
    """The Hub's faults over the run: cut downloads twice, an outage in the middle."""

    def __init__(self, hub: Any, duration_s: float, prefix: str) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self._hub, self._duration, self._prefix = hub, duration_s, prefix
        self._halt = threading.Event()

    def run(self) -> None:
        timeline = [
            (0.25, "truncate", self._prefix),
            (0.35, None, None),
            (0.45, "down", None),
            (0.60, None, None),
            (0.75, "truncate", self._prefix),
            (0.85, None, None),
        ]
        started = time.monotonic()
        for at, fault, paths in timeline:
            if self._halt.wait(max(0.0, started + at * self._duration - time.monotonic())):
                break
            self._hub.set_fault(fault, paths=paths)
            print(f"soak: {at:.0%} of the run: the Hub {'is ' + fault if fault else 'serves normally'}", flush=True)
        self._hub.set_fault(None)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class HostWatch(threading.Thread):
    """The most any pool's prepared adapters held over HOST_CACHE_BYTES, or all pools' adapters and pristine
    copies in host RAM over HOST_RAM_BYTES, sampled through the run."""

    def __init__(self, pools: Any) -> None:
        super().__init__(name="soak-host-watch", daemon=True)
        self._pools, self._halt = pools, threading.Event()
        from engine.pools.plan import PlanOptions  # the service imports the engine once the Hub's environment is set

        self._host_ram = PlanOptions.of(pools.pools[0].engine.settings).host_ram
        self.over = 0
        self.peak_rss = 0

    def run(self) -> None:
        while not self._halt.wait(0.25):
            self.sample()
            self.peak_rss = max(self.peak_rss, rss_bytes("VmRSS"))

    def sample(self) -> None:
        held = 0
        for pool in self._pools.pools:
            status = pool.engine.status()
            self.over = max(self.over, status.host_bytes - status.host_budget)
            host_pristine = status.pristine_bytes if not pool.engine.pristine_device_bytes else 0
            held += status.host_bytes + host_pristine
        if self._host_ram is not None:
            self.over = max(self.over, held - self._host_ram)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def rss_bytes(field: str) -> int:
    """This process's `VmRSS` (resident now) or `VmHWM` (its peak) from /proc, in bytes; 0 where there is none."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return 0
    found = [line.split()[1] for line in lines if line.startswith(field + ":")]
    return int(found[0]) * 1024 if found else 0


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder` (0 for none)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark to the resident memory now (Linux: `clear_refs` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_clients(config: dict[str, Any], root: Path, name: str) -> dict[str, Any]:
    """The client process for one run; its tally."""
    config_path, result_path = root / f"{name}-config.json", root / f"{name}-result.json"
    config_path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "-m", "bench.soak_clients", str(config_path), str(result_path)], check=True)
    return json.loads(result_path.read_text())


def threads(url: str) -> tuple[int, int, int, int]:
    """(other threads, preparation threads, the default executor's threads, single-thread pools' threads beyond one
    of each name) of this process, once the server loop's idle worker threads have been let go
    (`bench.soak_service`'s `/soak/idle`)."""
    httpx.post(url + "soak/idle", timeout=30).raise_for_status()
    names = [t.name for t in threading.enumerate()]
    prepare = sum(1 for n in names if _PREPARE.match(n))
    executor = sum(1 for n in names if _ASYNCIO.match(n))
    singles = Counter(n for n in names if _SINGLE.match(n))
    others = len(names) - prepare - executor - sum(singles.values())
    return others, prepare, executor, sum(c - 1 for c in singles.values())


def drain(service: Any) -> int:
    """Wait for every queue to empty once the clients are gone; the requests and prefetches left then."""
    deadline = time.monotonic() + _DRAIN_S
    while True:
        left = sum(p.engine.waiting + p.engine._prefetches.waiting for p in service.pools.pools)
        running = sum(p.engine.scheduler._running is not None for p in service.pools.pools)
        if left + running == 0 or time.monotonic() > deadline:
            return left + running
        time.sleep(0.2)


def ghost_runs(admitted: list[tuple[int, float]], departures: list[list[Any]]) -> list[str]:
    """Requests that reached the GPU more than GRACE_S after their client left: how each left, and how late."""
    gone = {int(seed): (float(at), str(how)) for seed, at, how in departures}
    return [
        f"seed {seed} ({gone[seed][1]}) ran {at - gone[seed][0]:.1f} s after its client left"
        for seed, at in admitted
        if seed in gone and at > gone[seed][0] + GRACE_S
    ]


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    # `kill -USR1 <pid>` prints every thread's stack: what a hang is waiting for.
    faulthandler.register(signal.SIGUSR1)
    # The soak's own lines, and the service's errors only (a full queue alone logs a warning per refusal).
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    # `POST /` logs every 5xx it answers, the provoked 503s too; the clients count and report the rest.
    logging.getLogger("serving.http.api").setLevel(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    port = _environment(root)
    from bench.soak_service import CUT_PREFIX, KLEIN_MODEL_ID, OVER_COUNT, WAN_MODEL_ID, Service

    service = Service(root, port, options.max_queue)
    base = {
        "url": service.url,
        "clients": options.clients,
        "max_queue": options.max_queue,
        "seed": options.seed,
        "loras": {"": [], **service.catalogue.to_json()},
        "fns": service.endpoints(),
        "sd15_base": service.pools.pools[1].base_model_id,
        "images": service.images,
        "wan_base": WAN_MODEL_ID,
        "klein_base": KLEIN_MODEL_ID,
        "over_count": OVER_COUNT,
    }
    started = time.perf_counter()
    try:
        warmup = {**base, "duration_s": options.warmup_s, "bursts": [0.5], "seed_base": 0, "oversized": False}
        warm = run_clients(warmup, root, "warmup")
        drain(service)
        time.sleep(12)  # idle worker threads of the warm-up expire (anyio's after 10 s)
        baseline = threads(service.url)[0]
        named = Counter(t.name for t in threading.enumerate())
        idle_rss, kernel_peak = rss_bytes("VmRSS"), reset_peak_rss()
        faults, watch = Faults(service.hub, options.duration_s, CUT_PREFIX), HostWatch(service.pools)
        faults.start()
        watch.start()
        print(f"soak: warm-up done ({warm.get('requests', 0)} requests); {baseline} threads; running", flush=True)
        bursts = [0.2, 0.5, 0.9]
        soak = run_clients(
            {**base, "duration_s": options.duration_s, "bursts": bursts, "seed_base": 500_000_000}, root, "soak"
        )
        faults.stop()
        queued = drain(service)
        watch.stop()
        peak = max(watch.peak_rss, rss_bytes("VmHWM") if kernel_peak else 0)
        disk = service.pools.default.engine.disk_cache
        disk.wait_idle(60)
        disk_over = max(0, disk.lora_bytes() - disk.budget)
        deadline = time.monotonic() + _SETTLE_S
        while threads(service.url)[0] > baseline and time.monotonic() < deadline:
            time.sleep(1.0)
        others, prepare, executor, doubled = threads(service.url)
        bound = sum(p.engine.settings.max_queue + p.engine.settings.prepare_workers for p in service.pools.pools)
        leaked = max(0, others - baseline) + max(0, prepare - bound) + max(0, executor - ASYNCIO_BOUND) + doubled
        # Named in the output when any leaked: what to look for.
        newer = sorted((Counter(t.name for t in threading.enumerate()) - named).elements()) if leaked else []
        late = ghost_runs(service.backend.admitted, warm["departures"] + soak["departures"])
        ghosts = queued + len(late)
        gradio_tmp = folder_bytes(root / "gradio-tmp")
    finally:
        service.close()
    exact = service.base_exact()
    accepted = ("bad_images_accepted", "oversized_accepted", "over_count_accepted")
    counted = ("requests", "ok", "refused", "errors_5xx", "cancelled", *accepted)
    totals = {k: warm.get(k, 0) + soak.get(k, 0) for k in counted}
    figures = {
        **{k: totals[k] for k in ("requests", "ok", "refused", "errors_5xx", "cancelled")},
        "ghosts": ghosts,
        "leaked_threads": leaked,
        "disk_over_budget_bytes": disk_over,
        "host_over_budget_bytes": max(0, watch.over),
        "bad_images_accepted": totals["bad_images_accepted"],
        "oversized_accepted": totals["oversized_accepted"],
        "over_count_accepted": totals["over_count_accepted"],
        "peak_rss_over_idle_bytes": max(0, peak - idle_rss),
        "gradio_tmp_bytes": gradio_tmp,
        "base_exact": exact,
    }
    accepted_by = Counter(warm.get("accepted_by", {})) + Counter(soak.get("accepted_by", {}))
    busy = warm.get("busy", 0) + soak.get("busy", 0)
    print(
        f"soak: {time.perf_counter() - started:.0f} s on {os.cpu_count()} CPUs; cancelled or left on purpose "
        f"{totals['cancelled']}, told busy in bursts {busy}, GPU runs {len(service.backend.admitted)}",
        flush=True,
    )
    for problem in warm.get("problems", []) + soak.get("problems", []):
        print(f"soak: 5xx: {problem}", flush=True)
    videos = [warm.get(k, 0) + soak.get(k, 0) for k in ("videos_sent", "videos_answered")]
    print(f"soak: videos: {videos[0]} sent, {videos[1]} answered", flush=True)
    sent_by = Counter(warm.get("sent_by", {})) + Counter(soak.get("sent_by", {}))
    for what, count in sorted(sent_by.items()):
        answered = f", {accepted_by[what]} answered with an image" if what in accepted_by else ""
        print(f"soak: images: {count} {what}{answered}", flush=True)
    print(
        f"soak: resident memory {idle_rss / 2**20:.0f} MiB idle after the warm-up, peak {peak / 2**20:.0f} MiB "
        f"({'the kernel high-water mark' if kernel_peak else 'sampled every 0.25 s'})",
        flush=True,
    )
    for ghost in late:
        print(f"soak: ghost: {ghost}", flush=True)
    if newer:
        print(f"soak: threads since the warm-up: {', '.join(newer)}", flush=True)
    if queued:
        print(f"soak: ghost: {queued} requests or prefetches still queued once every client had gone", flush=True)
    if options.json_path is not None:
        options.json_path.write_text(
            json.dumps({**figures, "problems": warm.get("problems", []) + soak.get("problems", [])})
        )
    print(
        "soak: "
        + " ".join(
            f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in figures.items()
            if key != "cancelled"
        ),
        flush=True,
    )
    good = all(figures[k] == 0 for k in PROBLEMS)
    return 0 if good and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
