"""Stand-ins for Ray Serve's deployment handles, so the cluster's front end is tested without Ray.

`Method.remote(...)` returns an awaitable, as Serve's `DeploymentResponse` is; `ReplicaHandle` calls a real
`PoolReplica` over an in-process engine, as Serve would; `front_end` is the ingress's routes over a
`ServeBackend` of such handles (no Gradio: the routes only).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from engine.pools.engine import Engine
from engine.settings import Settings
from serving.backends import blocking
from serving.backends.local import LocalBackend
from serving.backends.ray_serve import ServeBackend
from serving.cluster.ingress import wire_routes
from serving.cluster.replica import PoolReplica
from serving.cluster.stats import SetBook
from serving.handlers import Handlers
from serving.http.api import http_routes

__all__ = ["Method", "ReplicaHandle", "front_end", "replica_of", "stand_in_ray"]


class Method:
    """A handle's method: records each call's arguments; `failures` calls die first (with `died`)."""

    def __init__(self, fn: Callable[..., Any], died: Callable[[], BaseException] | None = None) -> None:
        self._fn = fn
        self._died = died
        self.failures = 0
        self.calls: list[tuple] = []

    def remote(self, *args: object) -> Any:
        self.calls.append(args)
        if self.failures > 0:
            self.failures -= 1
            assert self._died is not None
            return _raise(self._died())
        return self._fn(*args)


async def _raise(error: BaseException) -> Any:
    raise error


class ReplicaHandle:
    """A deployment handle over one in-process `PoolReplica`; `died` makes the error of a replica that died."""

    METHODS = ("generate", "compare", "describe", "check", "prefetch", "status", "origin")

    def __init__(self, replica: PoolReplica, died: Callable[[], BaseException] | None = None) -> None:
        for name in self.METHODS:
            setattr(self, name, Method(getattr(replica, name), died))
        self.options_seen: list[dict[str, object]] = []

    def options(self, **kwargs: object) -> ReplicaHandle:
        self.options_seen.append(kwargs)
        return self

    def method(self, name: str) -> Method:
        found: Method = getattr(self, name)
        return found


def replica_of(engine: Engine, name: str = "replica-1") -> PoolReplica:
    """A `PoolReplica` over `engine`, as `PoolReplica.__init__` builds it on Serve (without Serve)."""
    replica = object.__new__(PoolReplica)
    replica._engine, replica._backend, replica._replica = engine, LocalBackend.of(engine), name
    replica._book = SetBook()  # what its generate reports to the router
    replica._recipes = engine.settings.recipes  # whether the MP4 it packs carries the recipe
    return replica


def stand_in_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PoolReplica.generate` asks Serve for the request's multiplexed id: none here (no Ray imported)."""
    serve = types.SimpleNamespace(get_multiplexed_model_id=lambda: "")
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(serve=serve))
    monkeypatch.setitem(sys.modules, "ray.serve", serve)


def front_end(
    handles: list[Any], settings: Settings, retry_on: tuple[type[BaseException], ...] = ()
) -> tuple[Starlette, ServeBackend]:
    """The ingress's routes (`/v1/*`, `POST /`, metrics) over a `ServeBackend` of `handles`."""
    backend = blocking(ServeBackend.connect(handles, settings, retry_on=retry_on))
    # The routes need no catalogue: they generate, check and report.
    handlers = Handlers(backend, None, settings)  # type: ignore[arg-type]
    return Starlette(routes=[*wire_routes(handlers), *http_routes(handlers, metrics=True)]), backend


def client(app: Starlette) -> Iterator[TestClient]:
    with TestClient(app) as made:
        yield made
