"""Runs paused on the device and resumed (issue 48) through the engine, on the tiny pipelines with step sharing on
(DEVICE_SHARING=step on the CPU): a tiny Wan video paused at several steps, between a step's two guidance passes,
inside a pass between two of its transformer's blocks (Wan 2.1, and Wan 2.2 A14B's second stage) and inside its VAE
decode, and a tiny SDXL image paused at several steps, each give the bytes of the same run unpaused; a video makes
one boundary per piece but its first, as many as `run_pieces` counted (its denoisers' blocks, called as diffusers'
pipeline calls them, and its decode chunks), and an image likewise (its steps and its decode); a video cancelled
while paused leaves at once and its pool serves exactly what it served before. A pause is forced by a rival run
(another pool's, one piece) sent to the device at that boundary: it goes first, having less left."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import GenerationCancelledError
from engine.events import RunShare
from engine.pipeline.compiled import CompiledDenoiser
from engine.pipeline.sharing import scheduler_for
from engine.pipeline.stepshare import DeviceScheduler, DeviceTurn
from engine.requests import GenerateRequest, LoraSpec
from tests.support.checks import generate
from tests.support.dit import local_engine
from tests.support.stepshare import Rivals, until
from tests.support.wan import CASES, FRAMES, PROMPT, write_wan_loras

CPU = torch.device("cpu")


def video(*loras: LoraSpec, seed: int = 7, guidance: float | None = None) -> GenerateRequest:
    return GenerateRequest(
        prompt=PROMPT, loras=loras, steps=4, width=64, height=64, seed=seed, num_frames=FRAMES, guidance=guidance
    )


def image(seed: int = 3) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, steps=5, seed=seed)


@contextmanager
def before_calls(module: torch.nn.Module, rivals: Rivals | None, at: set[int]) -> Iterator[list[int]]:
    """A rival sent before each of `module`'s `at`-th calls (hooks run in order: this one before the engine's
    boundary, so the run pauses there); yields the count of its calls."""
    calls = [0]

    def before(module: torch.nn.Module, args: object) -> None:
        calls[0] += 1
        if rivals is not None and calls[0] in at:
            rivals.send()

    handle = module.register_forward_pre_hook(before)
    try:
        yield calls
    finally:
        handle.remove()
    assert calls[0] >= max(at, default=0)


@contextmanager
def block_calls(*denoisers: torch.nn.Module) -> Iterator[list[int]]:
    """Counts the calls of `denoisers`' transformer blocks (Wan's `blocks`), all together."""
    with ExitStack() as stack:
        counts = [stack.enter_context(before_calls(b, None, set())) for d in denoisers for b in d.blocks]
        total = [0]
        yield total
    total[0] = sum(c[0] for c in counts)


def in_decode(pipe: Any, rivals: Rivals, chunk: int) -> AbstractContextManager[list[int]]:
    """A rival sent before the video VAE decoder's `chunk`-th call, so the run pauses inside its decode."""
    return before_calls(pipe.vae.decoder, rivals, {chunk})


class Counted(DeviceScheduler):
    """The scheduler, its runs' pieces and the pieces left at each boundary written down."""

    def __init__(self) -> None:
        super().__init__(first_guess_s=1e-9)
        self.pieces: list[int] = []
        self.step_pieces: list[int] = []
        self.chunks: list[int] = []
        self.left: list[int] = []

    @contextmanager
    def turn(self, pool: str, pieces: int, **options: Any) -> Iterator[DeviceTurn]:
        self.pieces.append(pieces)
        self.step_pieces.append(options.get("step_pieces", 1))
        self.chunks.append(options.get("chunks", 0))
        with super().turn(pool, pieces, **options) as turn:
            yield turn

    def boundary(self, run: Any, remaining: int, *, share: bool) -> None:
        self.left.append(remaining)
        super().boundary(run, remaining, share=share)


@pytest.fixture
def shared() -> Iterator[tuple[DeviceScheduler, list[RunShare]]]:
    # A rival's one piece counts as nearly nothing until measured, so it always has less left than a paused run.
    scheduler = DeviceScheduler(first_guess_s=1e-9)
    shares: list[RunShare] = []
    scheduler.subscribe(shares.append)
    with scheduler_for(CPU, scheduler):
        yield scheduler, shares


@pytest.fixture(scope="module")
def wan_loras(loaded_wan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stepshare-wan-loras")
    write_wan_loras(loaded_wan.pipe, folder, CASES[:2])
    return folder


@pytest.fixture
def wan_engine(loaded_wan, base_settings, wan_loras):
    settings = base_settings.replace(
        device_sharing="step", local_lora_dir=wan_loras, base_model_id=loaded_wan.base_model_id
    )
    with local_engine(loaded_wan, settings, wan_loras) as engine:
        yield engine


def frames(result: Any) -> list[bytes]:
    return [frame.tobytes() for frame in result.frames]


def test_a_video_paused_at_several_steps_and_inside_its_decode_gives_the_unpaused_bytes(wan_engine, shared):
    scheduler, shares = shared
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    alone = frames(generate(wan_engine, video(lora)))
    rivals = Rivals(scheduler)
    with in_decode(wan_engine.loaded.pipe, rivals, chunk=2):
        paused = frames(generate(wan_engine, video(lora), progress=rivals.at_steps({1, 2, 3})))
    rivals.join()
    assert paused == alone
    run = next(s for s in shares[::-1] if s.pool != "rival")
    assert run.video and run.pauses == 4 and [s.pool for s in shares].count("rival") == 4


def test_a_video_paused_between_its_guidance_passes_gives_the_unpaused_bytes(wan_engine, shared):
    scheduler, shares = shared
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    alone = frames(generate(wan_engine, video(lora)))
    pipe, rivals = wan_engine.loaded.pipe, Rivals(scheduler)
    # Forwards 2 and 6: step 1's and step 3's unconditional pass; after step 1 (its end is forward 3's boundary);
    # before the decode's first chunk (the last forward's end: no step callback makes that boundary now).
    with before_calls(pipe.transformer, rivals, {2, 6}), in_decode(pipe, rivals, chunk=1):
        paused = frames(generate(wan_engine, video(lora), progress=rivals.at_steps({1})))
    rivals.join()
    assert paused == alone
    run = next(s for s in shares[::-1] if s.pool != "rival")
    assert run.video and run.pauses == 4 and [s.pool for s in shares].count("rival") == 4


def test_a_video_paused_inside_a_pass_between_two_blocks_gives_the_unpaused_bytes(wan_engine, shared):
    scheduler, shares = shared
    lora = LoraSpec(f"local:{CASES[0].file_name}", scale=0.8)
    alone = frames(generate(wan_engine, video(lora)))
    pipe, rivals = wan_engine.loaded.pipe, Rivals(scheduler)
    # The second block's calls 1, 4 and 7: inside step 1's conditional pass, step 2's unconditional one, step 4's
    # conditional one (the tiny transformer has two blocks; 4 steps of 2 passes).
    assert len(pipe.transformer.blocks) == 2
    with before_calls(pipe.transformer.blocks[1], rivals, {1, 4, 7}):
        paused = frames(generate(wan_engine, video(lora)))
    rivals.join()
    assert paused == alone
    run = next(s for s in shares[::-1] if s.pool != "rival")
    assert run.video and run.pauses == 3 and [s.pool for s in shares].count("rival") == 3


@pytest.mark.parametrize("guidance", [5.0, 1.0], ids=["two-passes", "no-guidance"])
def test_a_video_makes_a_boundary_between_each_two_pieces_run_pieces_counted(wan_engine, guidance):
    scheduler, pipe = Counted(), wan_engine.loaded.pipe
    with (
        scheduler_for(CPU, scheduler),
        before_calls(pipe.transformer, None, set()) as forwards,
        block_calls(pipe.transformer) as blocks,
        before_calls(pipe.vae.decoder, None, set()) as chunks,
    ):
        generate(wan_engine, video(guidance=guidance))
    # diffusers' WanPipeline runs the conditional and the unconditional pass one after the other with guidance on,
    # each through every block: a piece a block.
    assert forwards[0] == 4 * (2 if guidance > 1 else 1)
    assert blocks[0] == forwards[0] * len(pipe.transformer.blocks)
    assert scheduler.pieces == [blocks[0] + chunks[0]]
    assert scheduler.left == list(range(scheduler.pieces[0] - 1, 0, -1))
    # Its starvation bound counts its steps: a step's pieces (`STEP_SHARING_STARVE_STEPS` of them, each this many).
    assert scheduler.step_pieces == [blocks[0] // 4]


def test_a_compiled_denoiser_s_video_is_shared_a_forward_a_piece(wan_engine):
    # Hooks on its blocks would run inside the compiled forward (traced, breaking its graph): a forward a piece.
    # (Installed, never warmed: this shape runs its eager forward through the compiled one's wrapper.)
    scheduler, pipe = Counted(), wan_engine.loaded.pipe
    compiled = CompiledDenoiser.install(pipe.transformer, "default", backend="eager")
    try:
        with (
            scheduler_for(CPU, scheduler),
            before_calls(pipe.transformer, None, set()) as forwards,
            before_calls(pipe.vae.decoder, None, set()) as chunks,
        ):
            generate(wan_engine, video())
    finally:
        compiled.remove()
    assert scheduler.pieces == [forwards[0] + chunks[0]] and scheduler.step_pieces == [2]
    assert scheduler.left == list(range(scheduler.pieces[0] - 1, 0, -1))


def wan22_engine(loaded_wan22: Any, base_settings: Any) -> AbstractContextManager[Any]:
    settings = base_settings.replace(device_sharing="step", base_model_id=loaded_wan22.base_model_id)
    return local_engine(loaded_wan22, settings, settings.local_lora_dir)


def test_a_wan22_video_counts_the_blocks_of_both_its_stages(loaded_wan22, base_settings):
    scheduler, pipe = Counted(), loaded_wan22.pipe
    with (
        scheduler_for(CPU, scheduler),
        wan22_engine(loaded_wan22, base_settings) as engine,
        before_calls(pipe.transformer, None, set()) as high,
        before_calls(pipe.transformer_2, None, set()) as low,
        block_calls(pipe.transformer, pipe.transformer_2) as blocks,
        before_calls(pipe.vae.decoder, None, set()) as chunks,
    ):
        generate(engine, video())
    # A14B's low-noise stage runs the later steps on `transformer_2`, both guidance passes each, every block each.
    assert low[0] and high[0] + low[0] == 4 * 2
    assert blocks[0] == (high[0] + low[0]) * len(pipe.transformer.blocks)
    assert scheduler.pieces == [blocks[0] + chunks[0]]
    assert scheduler.left == list(range(scheduler.pieces[0] - 1, 0, -1))


def test_a_wan22_video_paused_between_the_blocks_of_each_stage_gives_the_unpaused_bytes(
    loaded_wan22, base_settings, shared
):
    scheduler, shares = shared
    pipe = loaded_wan22.pipe
    with wan22_engine(loaded_wan22, base_settings) as engine:
        alone = frames(generate(engine, video()))
        rivals = Rivals(scheduler)
        # Inside the first pass of each stage: the high-noise transformer's first call, the low-noise one's first.
        with (
            before_calls(pipe.transformer.blocks[1], rivals, {1}),
            before_calls(pipe.transformer_2.blocks[1], rivals, {1}),
        ):
            paused = frames(generate(engine, video()))
        rivals.join()
    assert paused == alone
    assert [s.pauses for s in shares if s.pool != "rival"][-1] == 2


def test_an_image_paused_at_several_steps_gives_the_unpaused_bytes(base_settings, loaded, shared):
    scheduler, shares = shared
    settings = base_settings.replace(device_sharing="step")
    with local_engine(loaded, settings, settings.local_lora_dir) as sdxl:
        alone = generate(sdxl, image()).image.tobytes()
        rivals = Rivals(scheduler)
        paused = generate(sdxl, image(), progress=rivals.at_steps({1, 3, 4})).image.tobytes()
        rivals.join()
    assert paused == alone
    assert [s.pauses for s in shares if s.pool != "rival"][-1] == 3


def test_an_image_makes_a_boundary_between_each_two_pieces_run_pieces_counted(base_settings, loaded):
    # Its steps (the first with its prompt's encoding), then its VAE decode: the boundary at its last step's end
    # sets the decode apart, a piece of its own, timed apart as a video's decode chunks (`chunks`).
    scheduler, pipe = Counted(), loaded.pipe
    settings = base_settings.replace(device_sharing="step")
    with (
        scheduler_for(CPU, scheduler),
        local_engine(loaded, settings, settings.local_lora_dir) as sdxl,
        before_calls(pipe.unet, None, set()) as steps,
        before_calls(pipe.vae.decoder, None, set()) as decodes,
    ):
        generate(sdxl, image())
    assert steps[0] == image().steps and decodes[0] == 1
    assert scheduler.pieces == [steps[0] + decodes[0]] and scheduler.chunks == [1] and scheduler.step_pieces == [1]
    assert scheduler.left == list(range(scheduler.pieces[0] - 1, 0, -1))


def test_a_video_cancelled_while_paused_leaves_at_once_and_its_pool_serves_what_it_served(wan_engine, shared):
    scheduler, _ = shared
    served = video(LoraSpec(f"local:{CASES[0].file_name}"))
    before = frames(generate(wan_engine, served))
    cancel = threading.Event()

    def hold() -> None:
        # The video is paused behind this rival: cancelling it ends it while the rival still holds the device.
        cancel.set()
        until(lambda: scheduler.waiting == 0)

    rivals = Rivals(scheduler, hold)
    other = video(LoraSpec(f"local:{CASES[1].file_name}", scale=0.7), seed=9)
    with pytest.raises(GenerationCancelledError):
        generate(wan_engine, other, cancel=cancel, progress=rivals.at_steps({2}))
    rivals.join()
    assert not scheduler.busy and scheduler.waiting == 0
    assert frames(generate(wan_engine, served)) == before
