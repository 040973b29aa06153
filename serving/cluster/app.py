"""LoRA Switchboard past one GPU: a Ray Serve application with one deployment per base-model pool.

    MODEL_ID=stabilityai/stable-diffusion-xl-base-1.0 CLUSTER_REPLICAS=5 serve run serving.cluster.app:app
    python -m serving.cluster.app               # the same, from the environment, until Ctrl-C

The ingress serves the Space's own app (UI, named API, `POST /`, metrics) over a `ServeBackend`; each pool's
replicas run the Space's engine, chosen by ours or Serve's multiplexed router (`CLUSTER_ROUTER`), shaped by the
settings (`serving.cluster.shape`).
Set-up and the parts: docs/internals.md, "serving/cluster/app.py", and docs/cluster.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ray import serve
from ray.exceptions import RayActorError
from ray.serve import Application
from ray.serve.exceptions import ReplicaUnavailableError

from engine.settings import Settings
from serving.cluster.ingress import Ingress
from serving.cluster.replica import PoolReplica
from serving.cluster.shape import deployment_name, pool_options

__all__ = ["app", "build_app", "deployment_name", "local_cluster", "local_serve", "main"]

logger = logging.getLogger(__name__)


def build_app(settings: Settings) -> Application:
    """The Serve application for `settings`; nothing is loaded until Serve starts the replicas."""
    pools = []
    # MODELS (or MODEL_ID as one pool), the default first: one deployment each, shaped by serving.cluster.shape.
    for spec in settings.pool_settings:
        deployment = serve.deployment(**pool_options(settings, spec))(PoolReplica)
        pools.append(deployment.bind(settings.for_pool(spec), settings.cluster_adapter_sets))
    # The front end passes work on and waits; the default of 5 ongoing requests would queue what it can pass on.
    ingress = serve.deployment(name="ingress", max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0})(
        serve.ingress()(Ingress)
    )
    # A replica that died or became unavailable: the request is sent again, to another replica.
    return ingress.bind(pools, settings, (RayActorError, ReplicaUnavailableError))


@contextmanager
def local_serve(*, port: int, num_cpus: int = 2) -> Iterator[str]:
    """Start Ray and Serve on this machine, yield the HTTP URL; shut both down after. No application yet:
    `serve.run(build_app(settings), name=..., route_prefix="/")` deploys one (`local_cluster` does).

    For tests and benchmarks: worker processes get the Hub variables of this process (a stand-in Hub's endpoint),
    since Ray starts them from its own daemon; they import this project as installed (`pip install -e .`).
    """
    import ray

    env = {k: v for k, v in os.environ.items() if k.startswith(("HF_", "OMP_"))}
    ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env={"env_vars": env})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}/"
    finally:
        serve.shutdown()
        ray.shutdown()


@contextmanager
def local_cluster(settings: Settings, *, port: int, num_cpus: int = 2, name: str = "switchboard") -> Iterator[str]:
    """`local_serve` with `build_app(settings)` deployed at its root."""
    with local_serve(port=port, num_cpus=num_cpus) as url:
        serve.run(build_app(settings), name=name, route_prefix="/")
        yield url


def main() -> None:
    settings = Settings.from_env(os.environ)
    logging.basicConfig(level=settings.log_level_number, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.info("deploying %d pool(s) of %d replica(s)", len(settings.pool_settings), settings.cluster_replicas)
    serve.run(build_app(settings), blocking=True)


# `serve run serving.cluster.app:app` imports this: the settings are read now, nothing is loaded or downloaded.
app = build_app(Settings.from_env(os.environ))

if __name__ == "__main__":
    main()
