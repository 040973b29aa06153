"""Each DiT family's pool LoRA files and stand-in Hub repos (tests/support/pools.py), written once a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from families import Family


@pytest.fixture(scope="session")
def pool_folders(tiny_models, hub, tmp_path_factory: pytest.TempPathFactory) -> dict[Family, Path]:
    from tests.support.pools import POOLS

    rows = {row.family: row for row in POOLS}

    class Folders(dict):
        def __missing__(self, family: Family) -> Path:
            folder = tmp_path_factory.mktemp(f"pool-loras-{family.value}")
            rows[family].write(tiny_models, hub, folder)
            self[family] = folder
            return folder

    return Folders()


@pytest.fixture
def family_pools(tiny_models, base_settings, clean_hub, pool_folders):
    """`family_pools(family)`: the family's row's pools (SDXL's first) over the session's tiny pipelines, reading
    its files and the stand-in Hub; closed after the test."""
    from contextlib import ExitStack

    from tests.support.dit import hub_pools
    from tests.support.pools import POOLS

    rows = {row.family: row for row in POOLS}
    with ExitStack() as stack:

        def open_pools(family: Family):
            row = rows[family]
            for served in row.served:  # pristine copies before any swap
                tiny_models.pristine(served)
            folder = pool_folders[family]
            return stack.enter_context(hub_pools(row.pipelines(tiny_models), base_settings, clean_hub.url, folder))

        yield open_pools
