"""`GrowingBackend`: a `LocalBackend` whose pools grow, those still loading listed and answered "loading".

The offline demo serves its image pools at once and loads more in the background once its page is up
(`serving.runtime`). Until one of those serves, it is listed (`pools()`, with its family's provisional defaults and
`loading`), and a request to it (naming its base, or one of the LoRAs it will bring) gets `PoolLoadingError`: a 503
with `Retry-After` on every door, through the one error tree, never a 404. Once loaded (`add`), a new
`LocalBackend` over every pool's engine takes the old one's place for the next requests; runs already admitted
finish on the old one's threads (each pool's own scheduler still lets one run at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from engine.compare import CompareRequest, CompareResult
from engine.errors import PoolLoadingError
from engine.events import EngineEvents, EngineObserver
from engine.families.registry import family_spec
from engine.outcomes import LoraCheck, PoolStatus, Preview, Progress, ServedPool
from engine.pipeline.modes import served_modes
from engine.pools.pools import Pools
from engine.pools.residency import Residency
from engine.requests import TINY_MAX_SIDE, GenerateRequest, GenerateResult, LoraSpec, ModelDefaults
from engine.settings import PoolSetting
from serving.backends import CellProgress, OnQueue
from serving.backends.local import LocalBackend

__all__ = ["GrowingBackend", "loading_pool"]


def loading_pool(setting: PoolSetting) -> ServedPool:
    """A pool still loading as the UI and the API list it: its family's modes, references and video, at a tiny
    pipeline's size and steps (the demo's pools are tiny), until the loaded pool's own defaults replace these."""
    spec = family_spec(setting.base_model_id)
    modes = served_modes(spec)
    takes_images = any(mode != "text-to-image" for mode in modes)
    defaults = ModelDefaults(
        steps=4,
        guidance=1.0,
        side=TINY_MAX_SIDE // 2,
        max_side=TINY_MAX_SIDE * 2,
        needs_image=spec.needs_image,
        modes=modes,
        max_reference_images=spec.max_reference_images if takes_images else 0,
        video=spec.video is not None,
        base_model=setting.base_model_id,
    )
    return ServedPool(setting.base_model_id, setting.model_id, str(spec.family), defaults, False, loading=True)


class GrowingBackend:
    """The `Backend` over a `LocalBackend` and the pools still loading beside it (see the module docstring).

    `loading`: the pools to come; `refs`: the LoRA refs each will bring (lower-cased ref: its base), so that a
    request naming one before its file exists is told to wait, not that it does not exist.
    """

    def __init__(
        self,
        backend: LocalBackend,
        loading: Iterable[PoolSetting] = (),
        *,
        refs: Mapping[str, str] | None = None,
        retry_after_s: int = 5,
    ) -> None:
        self._backend = backend
        self._retired: list[LocalBackend] = []
        self._loading = {p.base_model_id: loading_pool(p) for p in loading}
        self._refs = {ref.lower(): base for ref, base in (refs or {}).items()}
        self._retry_after_s = retry_after_s
        self._observers: list[EngineObserver] = []
        self._lock = threading.Lock()
        # Set once nothing is loading any more (every pool serves, or failed and was dropped).
        self._settled = threading.Event()
        if not self._loading:
            self._settled.set()
        # The default pool's engine reports how requests ended; it stays the default as pools join.
        self.events: EngineEvents = backend.events

    @property
    def served(self) -> Pools:
        """The pools serving now (start-up wiring and the metrics watch their engines)."""
        with self._lock:
            return self._backend.served

    @property
    def loading(self) -> tuple[str, ...]:
        """The bases still loading."""
        with self._lock:
            return tuple(self._loading)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait until no pool is loading any more; False if some still are after `timeout`."""
        return self._settled.wait(timeout)

    def pools(self) -> tuple[ServedPool, ...]:
        # Under the lock: a pool that joins (`add`) leaves `_loading` as the backend that serves it comes in, and a
        # read between the two would list it twice or not at all (handlers read this from worker threads too).
        with self._lock:
            return (*self._backend.pools(), *self._loading.values())

    def subscribe(self, observer: EngineObserver) -> None:
        with self._lock:
            self._observers.append(observer)
            self._backend.subscribe(observer)

    def add(self, pools: Pools) -> None:
        """`pools` (loaded) serve from now on, after those serving already; they are no longer loading."""
        with self._lock:
            old = self._backend
            engines = [p.engine for p in (*old.served.pools, *pools.pools)]
            default = engines[0]
            # The demo's tiny pools all fit: every one stays resident, as each `Pools` had them.
            grown = Pools(engines, default.resolver, Residency(default.loaded.device, None))
            backend = LocalBackend(grown, zero_gpu=default.settings.zero_gpu)
            for pool in pools.pools:
                for observer in self._observers:
                    pool.engine.events.subscribe(observer)
            self._backend, self._retired = backend, [*self._retired, old]
            for base in pools.served_bases:
                self._loading.pop(base, None)
            self._settle()

    def failed(self, bases: Sequence[str]) -> None:
        """`bases` will not load (their loading failed, and was logged): no longer listed."""
        with self._lock:
            for base in bases:
                self._loading.pop(base, None)
            self._settle()

    def _settle(self) -> None:
        if not self._loading:
            self._settled.set()

    # -- the operations --------------------------------------------------------------------------

    async def generate(
        self,
        request: GenerateRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: Progress | None = None,
        preview: Preview | None = None,
    ) -> GenerateResult:
        backend = self._refuse_loading(request.loras, base)
        return await backend.generate(request, base=base, on_queue=on_queue, progress=progress, preview=preview)

    async def compare(
        self,
        request: CompareRequest,
        *,
        base: str = "",
        on_queue: OnQueue | None = None,
        progress: CellProgress | None = None,
    ) -> CompareResult:
        backend = self._refuse_loading(request.loras if isinstance(request.loras, tuple | list) else (), base)
        return await backend.compare(request, base=base, on_queue=on_queue, progress=progress)

    async def check(self, spec: LoraSpec) -> LoraCheck:
        return await self._refuse_loading((spec,), "").check(spec)

    async def prefetch(self, spec: LoraSpec) -> None:
        await self._refuse_loading((spec,), "").prefetch(spec)

    async def status(self) -> tuple[PoolStatus, ...]:
        with self._lock:
            backend = self._backend
        return await backend.status()

    def close(self) -> None:
        with self._lock:
            self._loading.clear()
            self._settle()
            for retired in self._retired:
                retired.close(pools=False)
            self._backend.close()

    def _refuse_loading(self, loras: Iterable[object], base: str) -> LocalBackend:
        """PoolLoadingError when the request goes to a pool still loading: its named base, or a LoRA it brings;
        else the backend serving now, which runs it (read with `_loading`, under the lock, as `add` swaps both)."""
        with self._lock:
            loading, backend = dict(self._loading), self._backend
        if not loading:
            return backend
        named = base.strip().lower()
        wanted = {self._refs.get(str(getattr(spec, "ref", "")).strip().lower()) for spec in loras}
        for pool in loading.values():
            if named in (pool.base_model_id.lower(), pool.model_id.lower()) or pool.base_model_id in wanted:
                raise PoolLoadingError(
                    f"the {pool.family} pool {pool.base_model_id} is still loading (the offline demo loads it in "
                    f"the background once the page is up); accepted: the same request again in "
                    f"{self._retry_after_s} s, or now on a pool that serves: "
                    f"{', '.join(p.base_model_id for p in backend.pools())}",
                    retry_after_s=self._retry_after_s,
                )
        return backend
