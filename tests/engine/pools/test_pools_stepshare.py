"""Two image pools and one video pool sharing the device step by step (issue 48; DEVICE_SHARING=step on the CPU,
over the tiny SDXL, SD 1.5 and Wan pipelines): eight concurrent clients each get, byte for byte, what their request
gets alone, while the pools' runs interleave on the device."""

from __future__ import annotations

import pytest
import torch

from engine.events import RunShare
from engine.pipeline.sharing import scheduler_for
from engine.pipeline.stepshare import DeviceScheduler
from engine.requests import GenerateRequest
from families import IDENTITIES, Family
from tests.support.checks import generate
from tests.support.dit import hub_pools
from tests.support.mixed import assert_clients_get_what_they_get_alone

PROMPT = "a fox in a forest"
SERVED = (Family.SDXL, Family.SD15, Family.WAN)


def work(index: int) -> tuple[GenerateRequest, str]:
    """Request `index`: an SDXL or SD 1.5 image, or every third a Wan video (longer: more steps, five frames)."""
    family = SERVED[index % 3]
    if family is Family.WAN:
        request = GenerateRequest(prompt=PROMPT, steps=6, width=64, height=64, num_frames=5, seed=index % 4)
    else:
        request = GenerateRequest(prompt=PROMPT, steps=3, seed=index % 4)
    return request, IDENTITIES[family].model_id


@pytest.mark.timeout(900)
def test_eight_clients_over_two_image_pools_and_a_video_pool_each_get_their_solo_run(
    tiny_models, base_settings, clean_hub, tmp_path
):
    for family in SERVED:
        tiny_models.pristine(family)
    pipelines = [(tiny_models.loaded(f), IDENTITIES[f].model_id) for f in SERVED]
    scheduler = DeviceScheduler()
    shares: list[RunShare] = []
    scheduler.subscribe(shares.append)
    settings = base_settings.replace(device_sharing="step")
    with (
        scheduler_for(torch.device("cpu"), scheduler),
        hub_pools(pipelines, settings, clean_hub.url, tmp_path) as pools,
    ):

        def run(index: int) -> tuple[bytes, ...]:
            request, base = work(index)
            result = generate(pools, request, base=base)
            return tuple(f.tobytes() for f in (result.frames or (result.image,)))

        count = 18
        assert_clients_get_what_they_get_alone(run, count)
    assert len(shares) == 2 * count and {s.pool for s in shares} == {IDENTITIES[f].model_id for f in SERVED}
    # The concurrent half interleaved: runs were paused for other pools' steps.
    assert sum(s.pauses for s in shares[count:]) > 0
