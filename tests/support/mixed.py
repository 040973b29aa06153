"""Clients mixing pools at once (tests/engine/pools): a mixed run's requests, and the check that concurrent clients
each get exactly what their request gets alone. Each family's pool tests keep their own LoRAs and bases."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from engine.pools.pools import Pools
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate
from tests.support.dit import pool_request

T = TypeVar("T")


def mixed_request(table: Sequence[Sequence[str]], named_base: str, index: int) -> tuple[GenerateRequest, str]:
    """Request `index` of a mixed run and the base it names: `table`'s LoRA refs in turn at scales 0.5, 0.75 and
    1.0, seeds 0 to 4; a request without a LoRA names `named_base` every other time (else the default pool's)."""
    refs = table[index % len(table)]
    base = named_base if not refs and index % 2 else ""
    return pool_request(*(LoraSpec(r, scale=0.5 + 0.25 * (index % 3)) for r in refs), seed=index % 5), base


def assert_clients_get_what_they_get_alone(run: Callable[[int], T], count: int, *, clients: int = 8) -> list[T]:
    """`run(0)` to `run(count - 1)` one at a time, then all again from `clients` threads at once (thread w runs w,
    w + clients, ...): no thread raises and each run's outcome equals its own alone. The outcomes alone, returned."""
    expected = [run(index) for index in range(count)]
    got: dict[int, T] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(worker: int) -> None:
        try:
            for index in range(worker, count, clients):
                outcome = run(index)
                with lock:
                    got[index] = outcome
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    assert [got[index] for index in range(count)] == expected
    return expected


def assert_mixed_clients_get_their_own_images(
    pools: Pools, work: Sequence[tuple[GenerateRequest, str]], *, clients: int = 8
) -> list[bytes]:
    """`clients` clients sending `work`'s (request, named base) pairs at once across `pools` each get, byte for
    byte, the image that request gets alone (the same weights in the same storage: byte-equality holds). The
    images alone (RGB bytes), returned."""

    def image(index: int) -> bytes:
        request, base = work[index]
        return generate(pools, request, base=base).image.tobytes()

    return assert_clients_get_what_they_get_alone(image, len(work), clients=clients)
