"""Where generation happens, behind one interface: this process's pools (`local`) or a Ray Serve cluster (`remote`).

`Backend` has one async implementation of each operation. The handlers (`serving.handlers`) call it for the
UI, `gradio_client` and `POST /`; the cluster's replicas call a `LocalBackend` of their own. Cancelling the
task that awaits an operation cancels it: a queued request leaves its queue, a running one stops at its next
step, a remote one closes its connection. Scripts, tests and the demo's previews wait on an operation with
`blocking`, the one sync helper over this async path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from engine.compare import CompareRequest, CompareResult
from engine.events import EngineEvents, EngineObserver
from engine.outcomes import LoraCheck, PoolStatus, Preview, Progress, ServedPool
from engine.pools.scheduler import QueueView
from engine.requests import GenerateRequest, GenerateResult, LoraSpec

__all__ = ["Backend", "CellProgress", "OnQueue", "blocking", "submit_blocking"]

T = TypeVar("T")
# (cell, steps done, steps): a comparison's progress, cell by cell from 0.
CellProgress = Callable[[int, int, int], None]
# Where a request stands in its pool's queue: the place it joined at first, then each new one.
OnQueue = Callable[[QueueView], None]


class Backend(Protocol):
    """The operations every transport calls (see the module docstring)."""

    # Where this process reports how each request ended (`serving.http.metrics` subscribes).
    events: EngineEvents

    def pools(self) -> tuple[ServedPool, ...]:
        """The served pools, the default first (known at start)."""
        ...

    def subscribe(self, observer: EngineObserver) -> None:
        """Report every engine event of this backend (and how each request ended) to `observer`."""
        ...

    async def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: Progress | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        """One image on the pool its LoRAs were made for (else `base`'s, a served base repo id; else the default)."""
        ...

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        """A comparison grid's cells, all in one queue turn on one pool."""
        ...

    async def check(self, spec: LoraSpec) -> LoraCheck:
        """Resolve, download and prepare one LoRA on its pool without generating."""
        ...

    async def prefetch(self, spec: LoraSpec) -> None:
        """Prepare one LoRA into its pool's cache (a gallery click), so that the next request finds it ready."""
        ...

    async def status(self) -> tuple[PoolStatus, ...]:
        """Each pool's status, the default first."""
        ...

    def close(self) -> None:
        """Refuse new work and put every pool's base weights back (or close the connection to the cluster)."""
        ...


class _Loop:
    """One event loop in a daemon thread for every sync caller in the process: no loop (nor anyio's worker
    threads) is made per call, so a script running thousands of requests leaves no threads behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="blocking-loop", daemon=True).start()
                self._loop = loop
            return self._loop


_LOOP = _Loop()


def submit_blocking(operation: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start an operation on the shared loop; `.result()` waits for it, `.cancel()` cancels it."""
    return asyncio.run_coroutine_threadsafe(operation, _LOOP.get())


def blocking(operation: Coroutine[Any, Any, T]) -> T:
    """Run an operation to its end from sync code (scripts, tests, the demo's previews)."""
    return submit_blocking(operation).result()
