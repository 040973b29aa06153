"""One launched app (as a Space runs it: an engine with an HF token) for the tests that drive it with bad input,
faults, load and a shared queue; started once for this package instead of once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.requests import GenerateRequest
from tests.support.reliability_app import App, launch, serve_peft


@pytest.fixture(scope="package")
def app(loaded, base_settings, hub, fixtures) -> Iterator[App]:
    with launch(loaded, base_settings, hub, fixtures) as started:
        yield started


@pytest.fixture
def serving(app: App, fixtures) -> Iterator[tuple[GenerateRequest, bytes]]:
    """The app serving fixtures['peft'] at 0.7; checks after the test that nothing it served changed."""
    yield from serve_peft(app, fixtures)
