"""Each pool's Serve deployment options (serving/cluster/shape.py): router, slots, replicas or autoscaling."""

from __future__ import annotations

import pytest

from engine.errors import SettingsError
from engine.models import PoolSetting
from engine.settings import Settings
from families.sd15 import MODEL_ID as SD15_MODEL_ID
from serving.cluster.shape import ROUTER_CLASS, deployment_name, pool_options

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
TWO_POOLS = (PoolSetting("tiny", SDXL), PoolSetting("tiny-sd15", SD15_MODEL_ID))


def options(**changes: object) -> list[dict]:
    settings = Settings(pools=TWO_POOLS, **changes)  # type: ignore[arg-type]
    return [pool_options(settings, pool) for pool in settings.pool_settings]


def test_ours_is_the_default_router_and_takes_the_engines_queue_as_slots():
    sdxl, sd15 = options(cluster_replicas=3, max_queue=8, cluster_stats_period_s=0.5)
    assert sdxl["name"] == deployment_name(SDXL) == "pool-stabilityai-stable-diffusion-xl-base-1-0"
    assert sdxl["num_replicas"] == 3 and "autoscaling_config" not in sdxl
    assert sdxl["max_ongoing_requests"] == 9
    router = sdxl["request_router_config"]
    assert router["request_router_class"] == ROUTER_CLASS
    assert router["request_routing_stats_period_s"] == 0.5
    assert router["request_router_kwargs"]["stale_after_s"] == 5.0
    assert sd15["request_router_config"] == router


def test_serves_own_router_is_one_setting_away_with_its_slots():
    (sdxl, _) = options(cluster_router="ray_multiplexed", cluster_max_ongoing=2)
    assert sdxl["max_ongoing_requests"] == 2
    assert "request_router_class" not in sdxl["request_router_config"]  # Serve's default
    assert Settings.from_env({"CLUSTER_ROUTER": "ray_multiplexed"}).cluster_router == "ray_multiplexed"


def test_autoscaling_follows_queue_depth_and_a_rarely_used_pool_scales_to_zero():
    sdxl, sd15 = options(
        cluster_replicas=2, cluster_max_replicas=6, cluster_target_ongoing=0.5, cluster_scale_to_zero=("tiny-sd15",)
    )
    assert "num_replicas" not in sdxl
    assert sdxl["autoscaling_config"] | {"upscale_delay_s": 0, "downscale_delay_s": 0} == {
        "min_replicas": 2,
        "initial_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 0.5,
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
    }
    # It starts with one replica, which describes the pool to the front end as it deploys, and may leave after.
    assert (sd15["autoscaling_config"]["min_replicas"], sd15["autoscaling_config"]["initial_replicas"]) == (0, 1)
    # A pool is named by its model or its base, in any case.
    (_, by_base) = options(cluster_max_replicas=2, cluster_scale_to_zero=(SD15_MODEL_ID.upper(),))
    assert by_base["autoscaling_config"]["min_replicas"] == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cluster_max_replicas": 2, "cluster_scale_to_zero": ("nobody/x",)}, r"names 'nobody/x', which is no pool"),
        ({"cluster_scale_to_zero": ("tiny-sd15",)}, r"needs autoscaling; accepted: with CLUSTER_MAX_REPLICAS"),
        ({"cluster_replicas": 3, "cluster_max_replicas": 2}, r"CLUSTER_MAX_REPLICAS=2 is below CLUSTER_REPLICAS=3"),
    ],
)
def test_a_shape_that_cannot_be_is_refused_by_name(changes, message):
    with pytest.raises(SettingsError, match=message):
        options(**changes)
