"""Each pool's Serve deployment options, from the settings (no ray here: `serving.cluster.app` applies them).

Router (`CLUSTER_ROUTER`): ours or Serve's multiplexed one. Slots: with ours a replica takes `MAX_QUEUE` waiting
plus one running (its engine queues); with Serve's, `CLUSTER_MAX_ONGOING`. Replicas: `CLUSTER_REPLICAS` each, or
autoscaled by queue depth up to `CLUSTER_MAX_REPLICAS`. Why each: docs/internals.md, "serving/cluster/shape.py".
"""

from __future__ import annotations

import re
from typing import Any

from engine.errors import SettingsError
from engine.models import PoolSetting
from engine.settings import Settings

__all__ = ["ROUTER_CLASS", "autoscaling_config", "deployment_name", "pool_options", "router_config", "router_kwargs"]

ROUTER_CLASS = "serving.cluster.router:LeastFinishRouter"
# Serve's autoscaler reacts after a load has lasted this long: a new replica costs a cold start (docs/cluster.md),
# so a burst shorter than a few images is absorbed by the queue; scaling down waits longer, to avoid churn.
UPSCALE_DELAY_S = 10.0
DOWNSCALE_DELAY_S = 300.0
# What the router assumes before any replica has reported (an SDXL image on an A10G: docs/fleet.md's costs,
# the mean 231 MB file at 100 MB/s); replaced by the pool's measured means as soon as they arrive.
DEFAULT_COSTS = {"inference_s": 8.5, "swap_s": 0.038, "prepare_s": 0.45, "download_s": 2.3}


def deployment_name(base_model_id: str) -> str:
    """A pool's deployment name: its base id with what Serve does not accept in names replaced."""
    return "pool-" + re.sub(r"[^A-Za-z0-9_-]+", "-", base_model_id).strip("-")


def router_kwargs(settings: Settings) -> dict[str, float]:
    """`LeastFinishRouter.initialize_state`'s arguments: the defaults above and when a report is stale (four
    periods missed, and never under 5 s: Serve's controller pulls reports in its own loop)."""
    return {**DEFAULT_COSTS, "stale_after_s": max(5.0, 4 * settings.cluster_stats_period_s)}


def router_config(settings: Settings) -> dict[str, Any]:
    """Serve's `request_router_config` for every pool of these settings."""
    config: dict[str, Any] = {
        "request_routing_stats_period_s": settings.cluster_stats_period_s,
        # A report that takes longer than two periods is late; Serve then asks again (the router's staleness
        # check is what routes around a replica that stopped answering).
        "request_routing_stats_timeout_s": 2 * settings.cluster_stats_period_s,
    }
    if settings.cluster_router == "ours":
        config.update(request_router_class=ROUTER_CLASS, request_router_kwargs=router_kwargs(settings))
    return config


def autoscaling_config(settings: Settings, pool: PoolSetting) -> dict[str, Any] | None:
    """Serve's `autoscaling_config` for `pool`, or None for a fixed `CLUSTER_REPLICAS`."""
    if not settings.cluster_max_replicas:
        return None
    low = 0 if _scales_to_zero(settings, pool) else settings.cluster_replicas
    if settings.cluster_max_replicas < low:
        raise SettingsError(
            f"CLUSTER_MAX_REPLICAS={settings.cluster_max_replicas} is below CLUSTER_REPLICAS={low}; accepted: "
            "0 (no autoscaling) or at least CLUSTER_REPLICAS"
        )
    return {
        "min_replicas": low,
        # One replica at deploy even for a pool that scales to zero: it describes the pool to the front end once
        # (`ServeBackend.connect`), then leaves when idle; nothing wakes it later to learn what it serves.
        "initial_replicas": max(low, 1),
        "max_replicas": settings.cluster_max_replicas,
        "target_ongoing_requests": settings.cluster_target_ongoing,
        "upscale_delay_s": UPSCALE_DELAY_S,
        "downscale_delay_s": DOWNSCALE_DELAY_S,
    }


def pool_options(settings: Settings, pool: PoolSetting) -> dict[str, Any]:
    """`serve.deployment`'s keyword arguments for `pool`'s deployment."""
    _check_scale_to_zero(settings)
    ours = settings.cluster_router == "ours"
    options: dict[str, Any] = {
        "name": deployment_name(pool.base_model_id),
        "max_ongoing_requests": settings.max_queue + 1 if ours else settings.cluster_max_ongoing,
        "ray_actor_options": {"num_cpus": 0, "num_gpus": settings.cluster_gpus_per_replica},
        "request_router_config": router_config(settings),
    }
    scaling = autoscaling_config(settings, pool)
    if scaling is None:
        options["num_replicas"] = settings.cluster_replicas
    else:
        options["autoscaling_config"] = scaling
    return options


def _scales_to_zero(settings: Settings, pool: PoolSetting) -> bool:
    names = {name.lower() for name in settings.cluster_scale_to_zero}
    return pool.model_id.lower() in names or pool.base_model_id.lower() in names


def _check_scale_to_zero(settings: Settings) -> None:
    if settings.cluster_scale_to_zero and not settings.cluster_max_replicas:
        raise SettingsError(
            f"CLUSTER_SCALE_TO_ZERO={','.join(settings.cluster_scale_to_zero)!r} needs autoscaling; accepted: "
            "with CLUSTER_MAX_REPLICAS set to the most replicas a pool may have"
        )
    served = {name.lower() for pool in settings.pool_settings for name in (pool.model_id, pool.base_model_id)}
    for name in settings.cluster_scale_to_zero:
        if name.lower() not in served:
            accepted = ", ".join(p.model_id for p in settings.pool_settings)
            raise SettingsError(f"CLUSTER_SCALE_TO_ZERO names {name!r}, which is no pool; accepted: {accepted}")
