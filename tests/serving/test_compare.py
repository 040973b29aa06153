"""Live previews on `/generate` and comparison grids on `/compare`, through `gradio_client` against the launched app."""

from __future__ import annotations

import io
import json
from dataclasses import fields

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from engine.result_parts import AdapterUse
from tests.support.app_server import AppServer
from tests.support.reliability_app import CLIENT_GENERATE

GENERATE = CLIENT_GENERATE
COMPARE = {
    "prompt": "a fox in a forest",
    "negative_prompt": "",
    "loras": "",
    "scales": "",
    "include_base": False,
    "steps": 2,
    "guidance": 5.0,
    "width": 64,
    "height": 64,
    "seed": 21,
}


def pixels(path: str) -> bytes:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.convert("RGB").tobytes()


def generated(client: Client, **overrides: object) -> bytes:
    path, _ = client.predict(**(GENERATE | overrides), api_name="/generate")
    return pixels(path)


def compared(client: Client, **overrides: object) -> tuple[str, list[dict], dict]:
    return client.predict(**(COMPARE | overrides), api_name="/compare")


def test_generate_yields_previews_before_the_final_image(client, fixtures):
    job = client.submit(**(GENERATE | {"steps": 8, "lora": fixtures["peft"]}), api_name="/generate")
    final_path, final_info = job.result(timeout=300)
    outputs = job.outputs()
    previews = [(path, info) for path, info in outputs[:-1] if info.get("preview")]
    steps = [info["step"] for _, info in previews]
    # PREVIEW_EVERY=2 gives steps 2, 4, 6 (never the last); a slow reader may see only the newest of them.
    assert steps
    assert steps == sorted(set(steps))
    assert set(steps) <= {2, 4, 6}
    assert "preview" not in final_info
    assert final_info["steps"] == 8
    assert outputs[-1][0] == final_path
    final = pixels(final_path)
    assert all(pixels(path) != final for path, _ in previews)
    # The previews watched the run without touching it: the same request without a reader gives the same image.
    assert final == generated(client, steps=8, lora=fixtures["peft"])


def test_each_cell_equals_what_generate_returns_byte_for_byte(client, fixtures):
    grid_path, cells, info = compared(
        client, loras=f"{fixtures['peft']}\n{fixtures['second']}", scales="1, 0.8", include_base=True
    )
    assert info["labels"] == ["base", "peft (1)", "second (0.8)"]
    assert [c["caption"] for c in cells] == info["labels"]
    assert info["seed"] == 21
    assert [c["seed"] for c in info["cells"]] == [21, 21, 21]
    expected = [
        generated(client),
        generated(client, lora=fixtures["peft"], lora_scale=1.0),
        generated(client, lora=fixtures["second"], lora_scale=0.8),
    ]
    assert [pixels(c["image"]) for c in cells] == expected
    assert len(set(expected)) == 3
    with Image.open(grid_path) as grid:
        # Three 64² cells, each enlarged to 256² under its label.
        assert grid.width > 3 * 256
        assert grid.height > 256


def test_cells_share_the_sampler_and_clip_skip_each_equal_to_generate(client, fixtures):
    _, cells, info = compared(client, loras=fixtures["peft"], include_base=True, scheduler="DDIM", clip_skip=1)
    assert [c["sampler"] for c in info["cells"]] == ["DDIM", "DDIM"]
    expected = [
        generated(client, scheduler="DDIM", clip_skip=1),
        generated(client, lora=fixtures["peft"], scheduler="DDIM", clip_skip=1),
    ]
    assert [pixels(c["image"]) for c in cells] == expected


def test_a_scale_sweep_of_one_lora(client, fixtures):
    _, cells, info = compared(client, loras=fixtures["peft"], scales="0, 0.5, 1", seed=-1)
    assert info["labels"] == ["peft (0)", "peft (0.5)", "peft (1)"]
    seed = info["seed"]
    assert [c["seed"] for c in info["cells"]] == [seed] * 3
    assert [c["loras"][0]["scale"] for c in info["cells"]] == [0.0, 0.5, 1.0]
    for cell, scale in zip(cells, (0.0, 0.5, 1.0), strict=True):
        assert pixels(cell["image"]) == generated(client, lora=fixtures["peft"], lora_scale=scale, seed=seed)


def test_a_schedule_is_a_cell_equal_to_generate_with_that_window(client, fixtures):
    """/compare's `starts`/`ends` are each LoRA's window, as /generate's `lora_start`/`lora_end` (issue 51): one
    LoRA listed twice, on every step and from the start to half the steps, is two cells, each /generate's bytes."""
    peft = fixtures["peft"]
    _, cells, info = compared(client, loras=f"{peft}\n{peft}", scales="2", ends="1, 0.5", steps=4)
    assert info["labels"] == ["peft (2)", "peft (2 from 0 to 0.5)"]
    assert [c["loras"][0]["scale"] for c in info["cells"]] == [2.0, 2.0]
    whole = generated(client, lora=peft, lora_scale=2.0, steps=4)
    windowed = generated(client, lora=peft, lora_scale=2.0, lora_end=0.5, steps=4)
    assert [pixels(c["image"]) for c in cells] == [whole, windowed]
    # The window is in force: off for the last half of the steps, the image is not the LoRA's on every step.
    assert windowed != whole
    # A sweep's LoRA keeps its window in every cell.
    _, swept, info = compared(client, loras=peft, scales="1, 2", starts="0.5", steps=4)
    assert info["labels"] == ["peft (1 from 0.5 to 1)", "peft (2 from 0.5 to 1)"]
    assert pixels(swept[1]["image"]) == generated(client, lora=peft, lora_scale=2.0, lora_start=0.5, steps=4)


def posted(server: AppServer, steps: int, loras: list[dict]) -> bytes:
    """`POST /`'s image for COMPARE's request with `steps` and `parameters.loras` = `loras`."""
    parameters = {
        "negative_prompt": COMPARE["negative_prompt"],
        "num_inference_steps": steps,
        "guidance_scale": COMPARE["guidance"],
        "width": COMPARE["width"],
        "height": COMPARE["height"],
        "seed": COMPARE["seed"],
        "loras": loras,
    }
    document = {"inputs": COMPARE["prompt"], "parameters": parameters}
    answer = httpx.post(server.url, content=json.dumps(document), headers={"accept": "image/png"}, timeout=300)
    assert answer.status_code == 200, answer.text[:500]
    with Image.open(io.BytesIO(answer.content)) as image:
        return image.convert("RGB").tobytes()


def test_a_windowed_cells_info_carries_its_schedule_as_post_takes_it(server, client, fixtures):
    """Each cell's `loras[]` entry says its LoRA's schedule beside the step-0 `scale` (issue 51), in the form
    `parameters.loras[i].schedule` takes: sent back over `POST /`, it runs the cell's bytes (which `/generate` with
    the window reproduces: the test above). An unwindowed cell's entry is what it was (no `schedule`)."""
    peft = fixtures["peft"]
    _, cells, info = compared(client, loras=f"{peft}\n{peft}", scales="2", starts="0, 0.25", ends="1, 0.5", steps=4)
    whole, windowed = (cell["loras"][0] for cell in info["cells"])
    assert set(whole) == {f.name for f in fields(AdapterUse)}
    assert windowed["schedule"] == [[0.0, 0.0], [0.25, 2.0], [0.5, 0.0]]
    assert whole["scale"] == 2.0
    # `scale` stays the step-0 scale, as before (0 here: the window opens at a quarter of the steps).
    assert windowed["scale"] == 0.0
    carried = posted(server, 4, [{"path": peft, "scale": windowed["scale"], "schedule": windowed["schedule"]}])
    assert carried == pixels(cells[1]["image"]) != pixels(cells[0]["image"])
    assert carried == generated(client, lora=peft, lora_scale=2.0, lora_start=0.25, lora_end=0.5, steps=4)
    assert pixels(cells[0]["image"]) == posted(server, 4, [{"path": peft, "scale": whole["scale"]}])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loras": ""}, r"no LoRA to compare"),
        ({"loras": "a/one, a/two, a/three, a/four, a/five"}, r"5 LoRAs to compare; accepted: at most 4"),
        ({"loras": "a/one", "scales": "0, 0.25, 0.5, 0.75, 1, 1.25, 1.5"}, r"7 cells requested .*at most 6 cells"),
        ({"loras": "a/one\na/two", "scales": "1, 0.5, 0"}, r"3 scales for 2 LoRAs; accepted: no scale"),
        ({"loras": "a/one", "scales": "0, half"}, r"scale 'half' is not a number"),
        ({"loras": "a/one", "scales": "0, 0.5, 0"}, r"sweep scale 0 is listed twice"),
        ({"loras": "a/one", "scales": "0, 3"}, r"scale of a/one=3 is out of range; accepted: a number from -2 to 2"),
        ({"loras": "a/one\na/one"}, r"LoRA 'a/one' is listed twice"),
        ({"loras": "a/one\na/one", "ends": "0.5"}, r"LoRA 'a/one' is listed twice"),
        ({"loras": "a/one", "starts": "half"}, r"starts has 'half', not a number; accepted: fractions of the steps"),
        ({"loras": "a/one\na/two", "ends": "1, 0.5, 0.25"}, r"3 ends for 2 LoRAs; accepted: none \(every step\)"),
        ({"loras": "a/one", "ends": "1.5"}, r"end=1\.5 of .*a/one.* accepted: a fraction of the steps from 0 to 1"),
        (
            {"loras": "a/one", "scales": "0, 0.5, 1", "steps": 60},
            r"3 cells x 60 steps = 180 steps; accepted: at most 150 steps",
        ),
    ],
)
def test_bad_comparisons_are_refused_by_name(client, overrides, message):
    with pytest.raises(AppError, match=message):
        compared(client, **overrides)
