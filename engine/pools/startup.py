"""Start-up's loading: each pool's settings, its pipeline loaded as the plan made before loading places it, and,
with `COMPILE`, each warmed up and compiled on the device in turn.

The loader is told what the first plan decided (`engine.pools.plan`): the components left in host RAM, and the
denoiser's storage wherever it differs from what the pool's own `QUANTIZE` gives it. One pool loads from the
whole settings, as before pools existed; several each from their own, `VAE_ID` kept only where it fits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from engine.devices import same_device
from engine.errors import SettingsError
from engine.pipeline.loading import LoadedPipeline, warm_up
from engine.pipeline.vae import vae_mismatch
from engine.pools.flat import FlatWeights, module_tensors
from engine.pools.plan import MemoryPlan, PlanOptions, pipeline_modules, storage_to_load
from engine.settings import PoolSetting, Settings
from engine.storage import unplanned_storage

__all__ = ["compiled", "load_pipelines", "pools_settings"]

logger = logging.getLogger(__name__)


def pools_settings(settings: Settings) -> list[Settings]:
    """Each pool's own settings (the default's first): one pool's from the whole; several with `VAE_ID` kept only
    for the pools whose latent space it fits (SDXL's VAE must not decode SD 1.5's latents), SettingsError when it
    fits none of the pools that could take it."""
    if len(settings.pool_settings) == 1:
        return [settings.for_pool(settings.pool_settings[0])]
    chosen, refused = [], []
    for pool in settings.pool_settings:
        own = settings.for_pool(pool)
        mismatch = vae_mismatch(own)
        if mismatch is not None:
            logger.warning("%s; pool %s keeps its own VAE", mismatch, pool.base_model_id)
            refused.append(mismatch)
            own = own.replace(vae_id=None)
        chosen.append(own)
    if refused and not any(own.vae_id and not own.loads_tiny for own in chosen):
        raise SettingsError(f"VAE_ID fits none of the pools: {' / '.join(refused)}")
    return chosen


def load_pipelines(
    settings: Settings,
    own_settings: Sequence[Settings],
    load: Callable[..., LoadedPipeline],
    first: MemoryPlan | None,
    options: PlanOptions,
    *,
    warm: bool,
    park: bool,
) -> list[LoadedPipeline]:
    """Each pool's pipeline as `first` places it: one pool loaded from the whole settings (and warmed, with
    `warm`); several cold, each from its own settings, parked in host RAM with `park` (when there is a plan)."""
    pools = settings.pool_settings
    if len(pools) == 1:
        return [load(settings, warm=warm, **_placement(settings, pools[0], first, options))]
    parked = {"park": True} if park else {}
    return [
        load(own, warm=False, **parked, **_placement(own, pool, first, options))
        for own, pool in zip(own_settings, pools, strict=True)
    ]


def _placement(told: Settings, pool: PoolSetting, first: MemoryPlan | None, options: PlanOptions) -> dict[str, object]:
    """What `pool`'s loader is told besides `told`: the components `first` leaves in host RAM, and the denoiser's
    storage wherever it differs from what `told`'s QUANTIZE gives the loader on its own (the denoiser is quantized
    as it loads, in host RAM, where the one decision says so)."""
    host = first.host_components(pool.base_model_id) if first is not None else ()
    chosen: dict[str, object] = {"host_components": host} if host else {}
    storage = storage_to_load(first, options, pool.base_model_id)
    if storage != unplanned_storage(told.quantize):
        chosen["storage"] = storage
    return chosen


def compiled(loaded: Sequence[LoadedPipeline], settings: Settings, *, moves: bool) -> list[LoadedPipeline]:
    """Each pool warmed up and compiled with its own settings, on the device in turn (`moves`: the plan has the
    pools take turns there)."""
    pools = settings.pool_settings
    return [_warmed(lp, settings.for_pool(pool), moves=moves) for pool, lp in zip(pools, loaded, strict=True)]


def _warmed(loaded: LoadedPipeline, settings: Settings, *, moves: bool) -> LoadedPipeline:
    """`loaded` warmed up (and compiled) on its device; one parked in host RAM goes back there afterwards.

    A pool that `moves` (the pools take turns on the device) is compiled without CUDA graphs: each move puts its
    weights at new addresses, torch records every shape's graph again at the next call and keeps the earlier ones
    (`StaticInputIdxMismatch` is not counted toward its re-record limit), so graphs and their memory would grow with
    every move, and each move-in would pay a recording per shape. Pools that stay resident keep them.
    """
    if moves and settings.compile in ("reduce-overhead", "max-autotune"):
        logger.info("pool %s takes turns on the device: compiled without CUDA graphs", loaded.base_model_id)
    modules = pipeline_modules(loaded)
    if all(same_device(t.device, loaded.device) for t in module_tensors(modules)):
        return warm_up(loaded, settings, cudagraphs=not moves)
    # Moved the way the residency moves pools (one flat buffer each way); back out before the next pool comes in.
    weights = FlatWeights(modules, pin=False)
    weights.to_device(loaded.device)
    try:
        return warm_up(loaded, settings, cudagraphs=not moves)
    finally:
        weights.to_host()
