"""The Compare tab's windows (issue 51: "a schedule is a cell"), without a browser: the tab's event is sent to the
launched app's queue as the page sends it, and its cells are the bytes `/compare` answers for the same windows, its
refusals `/compare`'s words (one parser for both doors)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from gradio_client.exceptions import AppError

from tests.serving.test_compare import COMPARE, compared, pixels
from tests.support.page_events import completed, event, page_values

# The tab's form for COMPARE's request: the size menu's value, the seed kept, the form's CLIP skip 1 (none skipped).
FORM = {
    "prompt": COMPARE["prompt"],
    "negative": COMPARE["negative_prompt"],
    "include_base": False,
    "size": "64x64",
    "steps": COMPARE["steps"],
    "guidance": COMPARE["guidance"],
    "seed": COMPARE["seed"],
    "randomize": False,
    "sampler": "",
    "clip_skip": 1,
}


def compared_in_the_tab(server: Any, **fields: object) -> dict[str, Any]:
    """The Compare button's event with `fields` (the handler's parameter names) over the page's other values; the
    queue's last message (`success`, and `output`: the grid, cells, info, seed and status, or the error)."""
    data = page_values(server.demo, "compare_ui")
    handler = event(server.demo, "compare_ui")[1].fn
    names = [name for name in inspect.signature(handler).parameters if name not in ("progress", "references")]
    for name, value in (FORM | fields).items():
        data[names.index(name)] = value
    return completed(server.url, server.demo, "compare_ui", data)


def test_the_tabs_windows_give_compares_cells_and_captions(server, client, fixtures):
    """One LoRA listed twice, on every step and from the start to half the steps: the tab's two cells are the bytes
    /compare answers for the same windows, captioned with the window."""
    peft = fixtures["peft"]
    windows = {"loras": f"{peft}\n{peft}", "scales": "2", "starts": "", "ends": "1, 0.5"}
    message = compared_in_the_tab(server, **windows, steps=4)
    assert message["success"], message
    _, cells, info_html, seed, _ = message["output"]["data"]
    _, expected, info = compared(client, **windows, steps=4)
    assert seed == info["seed"] == COMPARE["seed"]
    assert [cell["caption"] for cell in cells] == info["labels"] == ["peft (2)", "peft (2 from 0 to 0.5)"]
    assert [pixels(cell["image"]["path"]) for cell in cells] == [pixels(cell["image"]) for cell in expected]
    # The window is in force (off for the last half of the steps, the cell is not the whole run's).
    assert len({pixels(cell["image"]) for cell in expected}) == 2
    # The timing table under the grid names each cell by its caption, the window with it.
    assert "peft (2 from 0 to 0.5)" in info_html


@pytest.mark.parametrize(
    ("windows", "named"),
    [
        ({"starts": "half"}, "'half'"),
        ({"ends": "1.5"}, "end=1.5"),
        ({"starts": "0.5", "ends": "0.25"}, "start=0.5 and end=0.25"),
        ({"ends": "1, 0.5, 0.25"}, "3 ends for 1 LoRAs"),
    ],
)
def test_a_bad_window_in_the_tab_is_refused_as_compare_refuses_it(server, client, fixtures, windows, named):
    fields = {"loras": fixtures["peft"], **windows}
    message = compared_in_the_tab(server, **fields)
    assert not message["success"]
    error = message["output"]["error"]
    assert named in error
    with pytest.raises(AppError) as refused:
        compared(client, **fields)
    assert str(refused.value) == error
