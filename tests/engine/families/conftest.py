"""Each registered family's tiny pipeline, built once for the family tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pipes() -> dict[object, object]:
    from engine.families.registry import served_specs

    return {spec.family: spec.build_tiny(0) for spec in served_specs()}


@pytest.fixture
def family_engine(tiny_models, base_settings):
    """`family_engine(family, lora_dir)`: an engine over the family's tiny pipeline reading LoRAs from `lora_dir`
    only; each closed (its base restored) after the test, the newest first."""
    from contextlib import ExitStack

    from tests.support.dit import local_engine

    with ExitStack() as stack:

        def open_engine(family, lora_dir):
            loaded = tiny_models.loaded(family)
            settings = base_settings.replace(local_lora_dir=lora_dir, base_model_id=loaded.base_model_id)
            return stack.enter_context(local_engine(loaded, settings, lora_dir))

        yield open_engine
