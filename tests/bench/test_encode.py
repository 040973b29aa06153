"""`python -m bench.encode` runs end to end at its smallest size and ends with its result line."""

from __future__ import annotations

import re

import pytest

from bench.encode import main

LAST_LINE = re.compile(
    r"^encode_host_s=\d+\.\d+ streamed_s=(n/a|\d+\.\d+) cached_s=\d+\.\d+ host_vs_cached=\d+ host_vs_streamed=\S+$"
)


def test_the_encode_benchmark_runs_and_prints_its_line(capsys):
    main(["--layers", "1", "--scale", "32", "--tokens", "8", "--repeats", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert LAST_LINE.match(last), last


REFERENCE_LINE = re.compile(
    r"^reference_encode: prompt_s=\d+\.\d+ per_reference_s=-?\d+\.\d+ per_reference_vs_prompt=-?\d+\.\d+ "
    r"vision_share=-?\d+\.\d+$"
)


@pytest.mark.parametrize(
    "options",
    [["--tiny"], ["--scale", "4", "--text-layers", "1", "--vision-layers", "1"]],
    ids=["tiny", "qwen2.5-vl-7b-widths-over-4"],
)
def test_the_reference_encode_benchmark_runs_and_prints_its_line(capsys, options):
    """`--references`: each reference image's cost in Qwen-Image-Edit-2509/2511's prompt encoding."""
    main(["--references", "--count", "1", "--repeats", "1", "--device", "cpu", *options])
    out = capsys.readouterr().out.strip().splitlines()
    assert REFERENCE_LINE.match(out[-1]), out[-1]
    assert out[-2].startswith("reference encode: ") and "1 references of 384x384, on cpu" in out[-2]
