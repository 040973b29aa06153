"""One denoising run on the warm pipeline, with cancellation, progress and previews between steps.

The weights are whatever the caller fused before (`engine.weights.fused`); this module only calls the pipeline,
with the arguments its family reads (`FamilySpec.call_arguments`) and the tokenizers that fused set needs (its
pivotal-tuning tokens: `engine.formats.pivotal`) for the run alone (the pipeline is the run's own copy when the
request names a sampler or a CLIP skip: `engine.pipeline.schedulers`), and turns what it raises into the engine's
errors. Several images are one call with one generator per image (diffusers draws each image's noise from its
own, so each equals a run of its seed alone, up to the batch's rounding); when that batch does not fit the
device's memory, they are made one at a time, on the same weights. On a GPU one pool denoises at a time
(`engine.pipeline.stepshare`: a whole run, or with step sharing one step, at a time), so the memory plan keeps one
pool's working memory free, not every pool's. A run's `boundary(pieces left)` is called once per piece of its device
time but the first (`run_pieces`, `_boundaries`) and may pause the run there, its latents kept as they are: an
image's pieces are its steps (the first with its prompt's encoding) and its VAE decode (the boundary at its last
step's end sets it apart); a video's are its denoiser's blocks (`FamilySpec.denoiser_blocks`: forward pre-hooks
on each of Wan's transformer blocks, in each of its two guidance passes a step, so that an image waits one block,
not a whole pass), or its whole forwards where the family names no blocks or the denoiser's forward is compiled
(hooks inside a compiled forward would break its graph), and the latent frames of its VAE's decode (a forward
pre-hook on its decoder: Wan's decodes a frame at a time).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from engine.errors import GenerationCancelledError, GenerationError, SwitchboardError
from engine.families.spec import FamilySpec
from engine.outcomes import Preview, Progress
from engine.pipeline.modes import accepted_arguments, image_arguments
from engine.pipeline.preview import PreviewDecoder, StepPreviews
from engine.requests import CheckedRequest, Soundtrack
from engine.weights.tokens import swapped_tokenizers

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "Drawn",
    "decode_chunks",
    "decode_pieces",
    "denoiser_passes",
    "engine_error",
    "forward_pieces",
    "infer",
    "latent_frames",
    "made",
    "run_pieces",
    "step_pieces",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drawn:
    """What a run drew: its pictures (the images of the request's seeds, in their order; a video's frames, in
    order) and a video's sound (None: an image, or a video of a family without one)."""

    pictures: tuple[Image, ...]
    sound: Soundtrack | None = None


@torch.inference_mode()
def infer(
    pipe: Any,
    request: CheckedRequest,
    *,
    family: FamilySpec,
    tokenizers: Mapping[str, Any],
    progress: Progress | None,
    cancel: threading.Event | None,
    decoder: PreviewDecoder | None,
    preview_every: int,
    preview: Preview | None = None,
    at_step: Callable[[int, int], None] | None = None,
    boundary: Callable[[int], None] | None = None,
) -> Drawn:
    """The request's images, in the order of its seeds (a video's frames, in order, and its sound); `at_step`:
    `_images`'; `boundary(pieces left)` between each two pieces of its device time (`_boundaries`,
    `engine.pipeline.stepshare`)."""
    steps = request.steps
    decode = decode_pieces(pipe, request)
    boundaries = _boundaries(pipe, family, request, boundary)
    previews = StepPreviews.for_run(decoder, preview_every, steps, preview)
    # The latents a step hands its callback, made spatial for the decoders (a DiT packs them into tokens).
    unpack = family.preview.unpack
    # A video pipeline's spatial scale has its own name (Wan's `vae_scale_factor_spatial`); read only where the
    # latents are unpacked (LTX-2's pipeline has neither name, and no preview).
    vae_scale = 0 if unpack is None else int(getattr(pipe, "vae_scale_factor", None) or pipe.vae_scale_factor_spatial)

    def on_step(pipe: Any, step: int, timestep: object, callback_kwargs: dict) -> dict:
        if cancel is not None and cancel.is_set():
            # Raised, not `pipe._interrupt`: an interrupted diffusers pipeline still runs the VAE decode,
            # the most expensive single step at SDXL sizes, for an image nobody will see.
            raise GenerationCancelledError("the request was cancelled during generation")
        done = step + 1
        # The steps this run makes, as the pipeline counts them: with an image, diffusers runs a `strength` share
        # of `steps` (0.6 of 10: 6), by its own rounding per class.
        total = int(getattr(pipe, "_num_timesteps", None) or steps)
        if previews is not None:
            latents = callback_kwargs["latents"]
            if unpack is not None:
                latents = unpack(latents, request.height, request.width, vae_scale)
            previews(done, latents, pipe.scheduler, total)
        if progress is not None:
            progress(done, total)
        if at_step is not None and done < total:
            at_step(done, total)
        if at_step_end is not None:
            at_step_end(total - done + decode)
        return callback_kwargs

    call = partial(_images, pipe, request, family, on_step, at_step)

    # Called under the pipeline lock: the tokenizers are the base ones again after the run, however it ends.
    with swapped_tokenizers(pipe, tokenizers), boundaries as at_step_end:
        drawn = _batch_or_each(call, request.seeds)
    if cancel is not None and cancel.is_set():
        raise GenerationCancelledError("the request was cancelled during generation")
    return drawn


def _batch_or_each(call: Callable[[tuple[int, ...]], Drawn], seeds: tuple[int, ...]) -> Drawn:
    """`call(seeds)` as one batch; when the batch does not fit, one image at a time (the same images, each as a run
    of its seed alone; a video, one seed, has no such fallback, so no sound is split)."""
    try:
        return call(seeds)
    except torch.OutOfMemoryError:
        if len(seeds) == 1:
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return Drawn(tuple(image for seed in seeds for image in call((seed,)).pictures))


def decode_chunks(pipe: Any, request: CheckedRequest) -> int:
    """The pieces a video's VAE decode is shared in (its latent frames: Wan's decoder takes one at a time, a
    boundary before each but the first); 0 for an image, or a video whose VAE decodes whole."""
    if not request.num_frames or getattr(getattr(pipe, "vae", None), "decoder", None) is None:
        return 0
    return latent_frames(pipe, request.num_frames)


def latent_frames(pipe: Any, frames: int) -> int:
    """The latent frames a video of `frames` frames has (its VAE's temporal compression: Wan's 4, the first frame
    alone), as the video pipeline makes its latents."""
    return (frames - 1) // int(getattr(pipe, "vae_scale_factor_temporal", 4) or 4) + 1


def decode_pieces(pipe: Any, request: CheckedRequest) -> int:
    """The last pieces of a run (`run_pieces`) that are its VAE decode's, timed apart from its denoising pieces
    (`stepshare.left_s`): a video's decode chunks, else one, the decode whole (its last step's end is a boundary:
    the step callback's)."""
    return decode_chunks(pipe, request) or 1


def denoiser_passes(family: FamilySpec, request: CheckedRequest) -> int:
    """The denoiser forwards a step of `request` makes: its family's `guidance_passes` with classifier-free
    guidance on (diffusers' `do_classifier_free_guidance`: guidance above 1; Wan 2.2's second guidance scale
    changes the value, not the passes), else one."""
    return family.guidance_passes if request.guidance > 1 else 1


def forward_pieces(pipe: Any, family: FamilySpec) -> int:
    """The pieces one forward of a video's denoiser is shared in: its blocks (`_piece_modules`), else one."""
    return max(len(_piece_modules(pipe, family, family.denoiser)), 1)


def run_pieces(pipe: Any, request: CheckedRequest, family: FamilySpec) -> int:
    """The pieces a run holds the device for, one at a time with step sharing: an image's steps; a video's denoiser
    blocks (steps × `denoiser_passes` × `forward_pieces`; a second stage's transformer has the first's blocks, as
    Wan 2.2 A14B's two); then its `decode_pieces`. `infer` makes one boundary fewer (none before the first)."""
    return request.steps * step_pieces(pipe, request, family) + decode_pieces(pipe, request)


def step_pieces(pipe: Any, request: CheckedRequest, family: FamilySpec) -> int:
    """The pieces one denoising step of `request` is shared in (`run_pieces`): the starvation bound's unit is a step
    (`engine.pipeline.stepshare`)."""
    return denoiser_passes(family, request) * forward_pieces(pipe, family) if decode_chunks(pipe, request) else 1


def _piece_modules(pipe: Any, family: FamilySpec, name: str | None) -> list[torch.nn.Module]:
    """The modules whose calls start a video's denoising pieces on the denoiser `name`: its blocks where the family
    names them and its forward is the module's own (a compiled one, `engine.pipeline.compiled`, is installed on the
    instance: a hook inside it would be traced, breaking its graph at every block), else the denoiser itself."""
    denoiser = getattr(pipe, name, None) if name else None
    if denoiser is None:
        return []
    blocks = getattr(denoiser, family.denoiser_blocks, None) if family.denoiser_blocks else None
    if blocks is None or "forward" in vars(denoiser) or not len(blocks):
        return [denoiser]
    return list(blocks)


@contextmanager
def _boundaries(
    pipe: Any, family: FamilySpec, request: CheckedRequest, boundary: Callable[[int], None] | None
) -> Iterator[Callable[[int], None] | None]:
    """Calls `boundary(pieces left)` between each two of the run's pieces (`run_pieces`), one a piece; yields the
    boundary its step callback calls, if any (with the steps and decode chunks left after that step's end).

    - An image, or a video whose steps are one piece each: at each step's end (the step callback; the last one's is
      before the decode, an image's last piece), then before each latent frame of the video VAE's decode but the
      first (the last step's end was that boundary).
    - A video whose steps make several pieces (Wan's guidance passes, each its blocks): before each block of its
      denoisers but the run's first (forward pre-hooks on the first stage's blocks and a second stage's), and
      before each decode chunk; its step callback makes none (the next block's boundary is at the same point).
    """
    chunks = decode_chunks(pipe, request)
    if boundary is None:
        yield None
        return
    pieces = run_pieces(pipe, request, family)
    if not chunks or pieces - chunks == request.steps:
        with _hooks([pipe.vae.decoder] if chunks else [], boundary, chunks, first=2):
            yield boundary
        return
    starts = [m for name in (family.denoiser, family.second_stage) for m in _piece_modules(pipe, family, name)]
    with _hooks(starts, boundary, pieces, first=2), _hooks([pipe.vae.decoder], boundary, chunks, first=1):
        yield None


@contextmanager
def _hooks(modules: list[torch.nn.Module], boundary: Callable[[int], None], pieces: int, first: int) -> Iterator[None]:
    """`boundary(pieces left)` before each call of `modules` (together) from the `first`-th on, `pieces` being
    what is left before the first call."""
    calls = 0

    def before(module: torch.nn.Module, args: object) -> None:
        nonlocal calls
        calls += 1
        if calls >= first:
            boundary(max(pieces - calls + 1, 1))

    handles = [module.register_forward_pre_hook(before) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _images(
    pipe: Any,
    request: CheckedRequest,
    family: FamilySpec,
    on_step: Callable[..., dict],
    at_step: Callable[[int, int], None] | None,
    seeds: tuple[int, ...],
) -> Drawn:
    """One pipeline call for `seeds` (a batch when several), `on_step` called after each step. `at_step(step,
    steps)` (a scheduled LoRA's swaps: `FusedSet.stepper`) is called with step 0 before the call (a call after
    another, one image at a time, starts from step 0's weights again) and by `on_step` before each later step."""
    if at_step is not None:
        at_step(0, request.steps)
    generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
    # Only what a request set beyond the pipeline's defaults is passed (a one-image run's call is unchanged).
    extra: dict[str, Any] = {"clip_skip": request.clip_skip} if request.clip_skip else {}
    if len(seeds) > 1:
        extra["num_images_per_prompt"] = len(seeds)
    # An image run's class takes its own set (SDXL's img2img call has no width and height: the image sets them).
    arguments = family.call_arguments(request)
    if request.image is not None:
        arguments = {**accepted_arguments(pipe, arguments), **image_arguments(pipe, request)}
    output = pipe(
        **arguments,
        generator=generators if len(seeds) > 1 else generators[0],
        callback_on_step_end=on_step,
        output_type="pil",
        **extra,
    )
    # A video pipeline's output is its videos' frames (diffusers' `frames[0]`: the one video's, in order).
    frames = getattr(output, "frames", None)
    if frames is None:
        return Drawn(tuple(output.images))
    audio = getattr(output, "audio", None)
    if family.audio_rate is None or audio is None:
        return Drawn(tuple(frames[0]))
    return Drawn(tuple(frames[0]), Soundtrack(audio[0].detach().float().cpu().numpy(), family.audio_rate(pipe)))


def made(drawn: Drawn, request: CheckedRequest) -> dict[str, Any]:
    """A result's pictures: a video's frames (the first is its `image`) at its rate with its sound, or the images of the
    request's seeds (the first is `image`, the rest `more_images`)."""
    images = drawn.pictures
    if request.num_frames:
        return {"image": images[0], "frames": images, "fps": request.fps, "audio": drawn.sound}
    return {"image": images[0], "more_images": images[1:]}


def engine_error(error: BaseException, request: CheckedRequest) -> BaseException:
    """The error a transport should see for what a run raised (the error itself when it is already ours): out of
    memory said so; any other exception "the request failed" with an id the log carries beside it
    (`EngineError.unforeseen`), never its own text."""
    if isinstance(error, SwitchboardError):
        return error
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return GenerationError(
            f"out of memory generating {request.width}x{request.height}; try a smaller size or fewer LoRAs"
        )
    if isinstance(error, Exception):
        return GenerationError.unforeseen(error, logger, f"generating {request.width}x{request.height}")
    return error
