"""Four clients at once through the one Backend, mixing IC-LoRA runs on the tiny LTX-2 pool (each with its reference
video, two different ones, as a door carries them: read to their headers) and image runs on the tiny SDXL pool
(with and without an SDXL LoRA): each gets, byte for byte, the frames and sound (or the image) its request gets
alone, so an IC run never sees another's reference video or LoRA scale, nor an image run's pool, nor the other way
round; afterwards each pool serves the same as before, the LTX-2 pool on its own text-to-video pipeline."""

from __future__ import annotations

import pytest
from diffusers import LTX2Pipeline

from engine.requests import GenerateRequest, GenerateResult, LoraSpec
from engine.video_input import encoded_video
from families.ltx2 import MODEL_ID as LTX2
from families.sdxl import MODEL_ID as SDXL
from tests.support.checks import generate
from tests.support.dit import hub_pools
from tests.support.loras import kohya_file
from tests.support.ltx2 import CASES, FPS, FRAMES, PROMPT, write_ltx2_loras
from tests.support.mixed import assert_clients_get_what_they_get_alone
from tests.support.reference_video import reference_mp4

IC_LORA = f"local:{CASES[0].file_name}"
SDXL_LORA = "local:sdxl_kohya.safetensors"
# Two reference videos of other frames (a gradient 64 and 32 px wide) and lengths, as a door reads them.
VIDEOS = tuple(
    encoded_video(reference_mp4(frames=n, side=side), what="video", max_pixels=4096, max_frames=17)
    for n, side in ((9, 64), (17, 32))
)


def work_item(index: int) -> tuple[GenerateRequest, str]:
    """Request `index` and the base it names: an image and an IC run in turn; the IC runs alternate the two videos
    (the first two differ only by their video: the same seed and scale), every other image run has an SDXL LoRA."""
    if index % 2 == 0:
        loras = (LoraSpec(SDXL_LORA, scale=0.8),) if index % 4 == 2 else ()
        image = GenerateRequest(prompt=PROMPT, loras=loras, steps=2, width=64, height=64, seed=index, guidance=5)
        return image, SDXL
    video = VIDEOS[(index // 2) % 2]
    lora = LoraSpec(IC_LORA, scale=0.8 if index < 4 else 0.5 + index / 10)
    return _video(lora, seed=1 if index < 4 else index, reference_video=video), LTX2


def _video(*loras: LoraSpec, **fields: object) -> GenerateRequest:
    values = {"prompt": PROMPT, "steps": 2, "width": 64, "height": 64, "num_frames": FRAMES, "fps": FPS} | fields
    return GenerateRequest(loras=loras, **values)  # type: ignore[arg-type]


def outcome(result: GenerateResult) -> tuple[bytes, ...]:
    """A result's bytes: its image, or its frames and sound samples."""
    if not result.is_video:
        return (result.image.tobytes(),)
    assert result.audio is not None, "an LTX-2 video has its sound"
    return (*(frame.tobytes() for frame in result.frames), result.audio.samples.tobytes())


@pytest.mark.timeout(900)
def test_four_clients_mixing_ic_lora_runs_and_image_runs_each_get_their_own_and_the_pools_serve_the_same(
    loaded, loaded_ltx2, base_settings, clean_hub, tmp_path
):
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / SDXL_LORA.removeprefix("local:")).write_bytes(kohya_file(loaded.pipe, seed=32))
    write_ltx2_loras(loaded_ltx2.pipe, folder, CASES[:1])
    work = [work_item(index) for index in range(8)]
    plain = {
        SDXL: GenerateRequest(prompt=PROMPT, steps=2, width=64, height=64, seed=3, guidance=5),
        LTX2: _video(seed=3),
    }
    with hub_pools([(loaded, SDXL), (loaded_ltx2, LTX2)], base_settings, clean_hub.url, folder) as pools:
        before = {base: outcome(generate(pools, request, base=base)) for base, request in plain.items()}

        def answer(index: int) -> tuple[bytes, ...]:
            request, base = work[index]
            result = generate(pools, request, base=base)
            assert result.is_video == (base == LTX2) == (result.request.reference_video is not None)
            return outcome(result)

        alone = assert_clients_get_what_they_get_alone(answer, len(work), clients=4)
        after = {base: outcome(generate(pools, request, base=base)) for base, request in plain.items()}
    assert len(set(alone)) == len(alone), "each request makes an answer of its own (runs 1 and 3: their videos')"
    assert after == before, "each pool serves what it served before the mixed run"
    assert type(loaded_ltx2.pipe) is LTX2Pipeline, "the in-context pipeline was each IC run's own"
