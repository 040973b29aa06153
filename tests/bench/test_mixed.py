"""bench.mixed's options: `--device cuda` where torch sees no CUDA device is refused by name, before any replay; the
stand-in A10G's pieces keep their schedule, and it times a video's decode chunks apart as the engine does."""

from __future__ import annotations

import sys

import pytest
import torch

from bench import mixed
from engine.pipeline.stepshare import DeviceScheduler


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


class _Turn:
    """A run's turn as `held` sees it: its boundaries' times written down, a pause where asked (the device given
    away for `pause_s`)."""

    def __init__(self, clock: list[float], pause_at: dict[int, float]) -> None:
        self.clock, self.pause_at, self.pauses, self.at = clock, pause_at, 0, []

    def boundary(self, remaining: int) -> None:
        self.at.append(self.clock[0])
        if (pause := self.pause_at.get(remaining)) is not None:
            self.pauses += 1
            self.clock[0] += pause


def test_the_stand_in_s_pieces_keep_their_schedule_when_a_wait_overshoots():
    # Every wait wakes 0.4 ms late (as a loaded CPU's sleeps): the pieces still end on their schedule, the late
    # wake-up taken from the next piece, not added once per piece; after a pause the schedule starts again.
    clock = [0.0]

    def wait(seconds: float) -> None:
        clock[0] += seconds + 0.0004

    turn = _Turn(clock, pause_at={5: 1.0})
    mixed.held(turn, [0.001] * 10, clock=lambda: clock[0], wait=wait)  # type: ignore[arg-type]
    # Pieces 1-5 end at 1.4, 2.4, ... ms (each one's schedule, plus the last wake-up's 0.4 ms); the pause holds
    # 1 s; pieces 6-10 end 1 ms apart from its end.
    assert turn.at == pytest.approx([0.0014, 0.0024, 0.0034, 0.0044, 0.0054, 1.0068, 1.0078, 1.0088, 1.0098, 1.0108])


def test_the_stand_in_s_video_at_its_decode_counts_its_chunks_at_a_chunk_s_time():
    # The stand-in A10G takes a video's turn as the engine does (`turn(chunks=)`): once its first decode chunk
    # (1.0 s) is measured, the 20 chunks left count 20 s, not 20 × one average of blocks and chunks (8.1 s).
    clock = [0.0]
    scheduler = DeviceScheduler(clock=lambda: clock[0])
    ahead: list[float] = []

    def wait(seconds: float) -> None:
        # Before each piece's end: what a long image arriving now would have ahead of it (all of the video's left).
        ahead.append(scheduler.ahead_s("sdxl", 1e9))
        clock[0] += seconds

    options = mixed.Options(1.0, 0.0, 0.2, 2.0, 8.0, 0, 0)
    mixed.stand_in_run(scheduler, True, options, "step", clock=lambda: clock[0], wait=wait)
    blocks, block_s, chunks, chunk_s = mixed.WAN_A10G
    assert len(ahead) == blocks + chunks
    # In the decode's second chunk (its first measured): 20 chunks left at their own time.
    assert ahead[blocks + 1] == pytest.approx((chunks - 1) * chunk_s)
    assert scheduler.piece_s("wan") == pytest.approx(block_s) and scheduler.piece_s("wan decode") == pytest.approx(
        chunk_s
    )
