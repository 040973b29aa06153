"""bench.mixed's options: `--device cuda` where torch sees no CUDA device is refused by name, before any replay."""

from __future__ import annotations

import sys

import pytest
import torch

from bench import mixed


def test_device_cuda_without_cuda_is_refused_naming_the_option_and_what_is_accepted(monkeypatch, capsys):
    # Refused as on a machine without a GPU, wherever the test runs; the stand-in replays would take seconds first.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(mixed, "stand_in", lambda *a: pytest.fail("a replay ran before --device was checked"))
    with pytest.raises(SystemExit) as exited:
        mixed.main(["--quick", "--device", "cuda"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--device cuda: no CUDA device here" in error and "accepted: cpu, cuda" in error


def test_an_unknown_device_is_refused_with_the_accepted_ones(capsys):
    with pytest.raises(SystemExit):
        mixed.main(["--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_without_simpy_the_model_is_skipped_in_a_line_not_a_failure(monkeypatch, capsys):
    """gpu_check.sh's venv carries no simpy (a dev tool): the fleet model's lines are skipped there, the replays run."""
    monkeypatch.setitem(sys.modules, "bench.mixed_sim", None)  # its import raises ImportError, as without simpy
    options = mixed.Options(0.005, 0.25, 0.2, 2.0, 4.0, 0, 0, "cuda")
    assert mixed._model_gap(options, {}) is None
    assert capsys.readouterr().out.startswith("model: skipped (")
