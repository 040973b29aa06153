"""Four HTTP clients at once mixing an image pool (the tiny SDXL) and an LTX-2 pool (video with sound): each gets
the bytes its request gets alone (the PNG of an image, the MP4 with its sound track, or the sound alone as WAV;
x264, AAC and WAV write the same bytes for the same frames and samples: serving/video.py, serving/sound.py), with
and without an LTX-2 LoRA, so a video run never sees an image run's pool, LoRA or settings, nor the other way
round."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from families.ltx2 import MODEL_ID as LTX2
from families.sdxl import MODEL_ID as SDXL
from tests.support.app_server import serve_routes
from tests.support.checks import backend_of
from tests.support.dit import hub_pools, response_image
from tests.support.ltx2 import CASES, write_ltx2_loras
from tests.support.mixed import assert_clients_get_what_they_get_alone

PROMPT = "a fox running through snow"
_KINDS = ("image/png", "video/mp4", "image/png", "audio/wav")


def work_item(index: int) -> tuple[str, bytes, str]:
    """Request `index`: (the base its URL names, its `POST /` body, the answer's type): an image, an MP4 and a WAV
    in turn, every other video with an LTX-2 LoRA."""
    kind = _KINDS[index % len(_KINDS)]
    parameters: dict[str, object] = {"num_inference_steps": 2, "seed": index, "width": 64, "height": 64}
    if kind == "image/png":
        parameters |= {"guidance_scale": 5}
        return SDXL, json.dumps({"inputs": PROMPT, "parameters": parameters}).encode(), kind
    parameters |= {"num_frames": 9, "fps": 24}
    if index % 8 in (1, 7):
        parameters["loras"] = [{"path": f"local:{CASES[0].file_name}", "scale": 0.5 + index / 10}]
    return LTX2, json.dumps({"inputs": PROMPT, "parameters": parameters}).encode(), kind


@pytest.mark.timeout(900)
def test_four_http_clients_mixing_an_image_pool_and_an_ltx2_pool_each_get_their_own_bytes(
    loaded, loaded_ltx2, base_settings, clean_hub, fixtures, tmp_path
):
    folder = tmp_path / "loras"
    shutil.copytree(fixtures.local_dir, folder)
    write_ltx2_loras(loaded_ltx2.pipe, folder, CASES[:1])
    work = [work_item(index) for index in range(8)]
    with (
        hub_pools([(loaded, SDXL), (loaded_ltx2, LTX2)], base_settings, clean_hub.url, folder) as pools,
        serve_routes(backend_of(pools)) as url,
    ):

        def answer(index: int) -> bytes:
            base, content, kind = work[index]
            response = httpx.post(f"{url}models/{base}", content=content, headers={"accept": kind}, timeout=300)
            assert response.status_code == 200, response.text[:300]
            assert response.headers["content-type"] == kind
            assert "no sound" not in response.headers.get("x-warnings", "")
            return response_image(response) if kind == "image/png" else response.content

        alone = assert_clients_get_what_they_get_alone(answer, len(work), clients=4)
    assert len(set(alone)) == len(alone), "each request makes an answer of its own"
