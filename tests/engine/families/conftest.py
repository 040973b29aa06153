"""Each registered family's tiny pipeline, built once for the family tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pipes() -> dict[object, object]:
    from engine.families.registry import served_specs

    return {spec.family: spec.build_tiny(0) for spec in served_specs()}
