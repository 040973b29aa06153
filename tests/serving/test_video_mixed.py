"""Four HTTP clients at once mixing an image pool (the tiny SDXL) and a video pool (the tiny Wan): each gets the
bytes its request gets alone, the PNG of an image and the MP4 of a video (x264's output is the same for the same
frames: serving/video.py), so a video run never sees an image run's pool or settings, nor the other way round."""

from __future__ import annotations

import json

import httpx
import pytest

from families.sdxl import MODEL_ID as SDXL
from families.wan import MODEL_ID as WAN
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of
from tests.support.dit import hub_pools, response_image
from tests.support.mixed import assert_clients_get_what_they_get_alone

PROMPT = "a fox running through snow"


def work_item(index: int) -> tuple[str, bytes, str]:
    """Request `index`: (the base its URL names, its `POST /` body, the answer's type), a video every other time."""
    parameters: dict[str, object] = {"num_inference_steps": 2, "seed": index}
    if index % 2:
        parameters |= {"num_frames": 5, "fps": 8 + index}
        return WAN, json.dumps({"inputs": PROMPT, "parameters": parameters}).encode(), "video/mp4"
    parameters |= {"guidance_scale": 5, "width": 64, "height": 64}
    return SDXL, json.dumps({"inputs": PROMPT, "parameters": parameters}).encode(), "image/png"


@pytest.mark.timeout(900)
def test_four_http_clients_mixing_an_image_pool_and_a_video_pool_each_get_their_own_bytes(
    loaded, loaded_wan, base_settings, clean_hub, fixtures
):
    work = [work_item(index) for index in range(8)]
    with (
        hub_pools([(loaded, SDXL), (loaded_wan, WAN)], base_settings, clean_hub.url, fixtures.local_dir) as pools,
        serve_routes(backend_of(pools)) as url,
    ):

        def answer(index: int) -> bytes:
            base, content, kind = work[index]
            response = httpx.post(f"{url}models/{base}", content=content, headers={"accept": kind}, timeout=300)
            assert response.status_code == 200, response.text[:300]
            assert response.headers["content-type"] == kind
            return response.content if kind == "video/mp4" else response_image(response)

        alone = assert_clients_get_what_they_get_alone(answer, len(work), clients=4)
    assert len(set(alone)) == len(alone), "each request makes an answer of its own"
