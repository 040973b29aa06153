"""One launched app for the serving tests that only talk to it (gradio_client, `POST /`, `/metrics`, `/compare`,
the browser): started once for the package, with metrics on, instead of once per module.

Engines built by other tests share the session's tiny pipeline and snapshot its weights as they find them, so
the shared app puts the base back after every test that used it (as closing a module's own app did).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gradio_client import Client

from tests.support.app_server import AppServer, serve_fixture_app
from tests.support.clients import api_client


@pytest.fixture(scope="package")
def server(loaded, base_settings, hub, fixtures) -> Iterator[AppServer]:
    with serve_fixture_app(loaded, base_settings, hub, fixtures, metrics=True) as served:
        yield served


@pytest.fixture(scope="package")
def client(server: AppServer) -> Client:
    return api_client(server.url, verbose=False)


@pytest.fixture(autouse=True)
def _base_after_the_shared_app(request: pytest.FixtureRequest) -> Iterator[None]:
    # A module may serve an app of its own under the same name (test_civitai.py's pools): that one has no engine here.
    shared = request.getfixturevalue("server") if "server" in request.fixturenames else None
    yield
    if getattr(shared, "engine", None) is not None:
        shared.engine.restore_base_weights()  # type: ignore[union-attr]
