"""`python -m bench.encode` runs end to end at its smallest size and ends with its result line."""

from __future__ import annotations

import re

from bench.encode import main

LAST_LINE = re.compile(
    r"^encode_host_s=\d+\.\d+ streamed_s=(n/a|\d+\.\d+) cached_s=\d+\.\d+ host_vs_cached=\d+ host_vs_streamed=\S+$"
)


def test_the_encode_benchmark_runs_and_prints_its_line(capsys):
    main(["--layers", "1", "--scale", "32", "--tokens", "8", "--repeats", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert LAST_LINE.match(last), last
