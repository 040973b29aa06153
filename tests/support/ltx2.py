"""LTX-2 LoRA files for the tiny LTX-2 pipeline, in every naming diffusers' `LTX2Pipeline.lora_state_dict` reads:
diffusers/PEFT (`transformer.transformer_blocks.N.attn1.to_q.lora_A`, `connectors.video_connector...`), the LTX
trainer's originals (`diffusion_model.` for the transformer, `text_embedding_projection.` for the connectors), and
a transformer-only file (what diffusers' `save_lora_weights` writes). Each adapts the video, audio and cross-modal
attentions and the feed-forwards, the first two the connectors too. (kohya's `lora_down`/`lora_up` factors are no
naming this loader reads: PEFT's conversion leaves them, and diffusers loads nothing of them.) diffusers' reference
loads each file itself (load_lora_weights, then fuse_lora of the transformer and the connectors)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline
from PIL import Image

from serving.demo.synthetic import save_lora
from tests.support.dit import pixels
from tests.support.images import assert_images_close

Ltx2Format = Literal["peft", "original"]
_BLOCK_LAYERS = (
    "attn1.to_q",
    "attn1.to_v",
    "attn2.to_k",
    "attn2.to_out.0",
    "audio_attn1.to_q",
    "audio_attn2.to_v",
    "audio_to_video_attn.to_q",
    "video_to_audio_attn.to_k",
    "ff.net.0.proj",
    "audio_ff.net.2",
)
# Layers of the transformer (`transformer.`) and of the connectors (`connectors.`), by diffusers' names.
TRANSFORMER = tuple(f"transformer.transformer_blocks.{i}.{layer}" for i in range(2) for layer in _BLOCK_LAYERS)
CONNECTORS = (
    "connectors.text_proj_in",
    "connectors.video_connector.transformer_blocks.0.attn1.to_q",
    "connectors.audio_connector.transformer_blocks.0.ff.net.2",
)
PROMPT = "a photo of a fox in sks style"
# The audio samples' tolerance: the same float32 operations in the same order as diffusers' own run, up to the fused
# weights' rounding (the exact swap against diffusers' fuse_lora).
AUDIO_TOLERANCE = 1e-5
FRAMES = 9
FPS = 24
STEPS = 2


@dataclass(frozen=True)
class Ltx2Case:
    name: str
    fmt: Ltx2Format
    seed: int
    modules: Sequence[str] = (*TRANSFORMER, *CONNECTORS)

    @property
    def file_name(self) -> str:
        return f"ltx2_{self.name}.safetensors"


CASES = (
    Ltx2Case("peft", "peft", 71),
    Ltx2Case("original", "original", 72),
    Ltx2Case("transformer_only", "original", 73, modules=TRANSFORMER[4:]),
)


def factors(pipe: Any, modules: Sequence[str], *, rank: int = 4, seed: int = 1) -> dict:
    """Random (down, up) factors for each module, sized from the pipeline's own layers."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for module in modules:
        component, _, path = module.partition(".")
        layer = getattr(pipe, component).get_submodule(path)
        down = torch.randn(rank, layer.in_features, generator=generator) / layer.in_features**0.5
        up = torch.randn(layer.out_features, rank, generator=generator) * 0.5
        made[module] = (down, up)
    return made


def _original(module: str) -> str:
    """diffusers' name -> the LTX trainer's (the connectors' input projection is its `aggregate_embed`)."""
    component, _, path = module.partition(".")
    if component == "transformer":
        return f"diffusion_model.{path}"
    return f"text_embedding_projection.{path.replace('text_proj_in', 'aggregate_embed')}"


def lora_file(made: dict[str, tuple[torch.Tensor, torch.Tensor]], fmt: Ltx2Format) -> dict:
    """The tensors of a file in `fmt` names."""
    tensors: dict[str, torch.Tensor] = {}
    for module, (down, up) in made.items():
        stem = module if fmt == "peft" else _original(module)
        tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"] = down, up
    return tensors


def write_ltx2_loras(pipe: Any, folder: Path, cases: Sequence[Ltx2Case] = CASES) -> None:
    for case in cases:
        save_lora(folder / case.file_name, lora_file(factors(pipe, case.modules, seed=case.seed), case.fmt))


# An IC-LoRA for the tiny pool's catalogue, as the gallery shows it (its ModelSpec title).
IC_LORA = Ltx2Case("ic_weave", "peft", 74)
IC_TITLE = "IC Weave"


def write_ic_lora(pipe: Any, folder: Path) -> Path:
    """`IC_LORA` in `folder`: factors over the tiny LTX-2's transformer and connectors in diffusers' names, its
    ModelSpec architecture and title, and the reference downscale it was trained with in its metadata
    (`reference_downscale_factor`, where diffusers' `LTX2InContextPipeline` says IC-LoRAs keep it). Nothing else
    marks an IC-LoRA: the engine runs any LTX-2 LoRA in context when a request brings a reference video (and takes
    this factor as the default of one that sets no `reference_downscale`)."""
    made = factors(pipe, IC_LORA.modules, seed=IC_LORA.seed)
    metadata = {
        "modelspec.architecture": "ltx-2/lora",  # an architecture families/ltx2.py reads as LTX-2
        "modelspec.title": IC_TITLE,
        "reference_downscale_factor": "1",
    }
    return save_lora(folder / IC_LORA.file_name, lora_file(made, IC_LORA.fmt), metadata)


@dataclass(frozen=True)
class Reference:
    frames: list[Image.Image]
    audio: torch.Tensor
    rate: int


def diffusers_video(
    tiny_dir: Path, folder: Path, weight_name: str | None, scale: float = 1.0, image: Image.Image | None = None
) -> Reference:
    """diffusers' own video and sound on a pipeline of its own from `tiny_dir`: load_lora_weights, then fuse_lora of
    the transformer and the connectors; `STEPS` steps at 64 x 64, `FRAMES` frames at `FPS`, seed 7, the pool's CFG
    3; no LoRA when `weight_name` is None. With `image`: diffusers' LTX2ImageToVideoPipeline (`from_pipe` of that
    pipeline, the LoRA fused), `image` its first frame."""
    pipe: Any = LTX2Pipeline.from_pretrained(tiny_dir)
    pipe.set_progress_bar_config(disable=True)
    if weight_name is not None:
        pipe.load_lora_weights(str(folder), weight_name=weight_name, adapter_name="a")
        pipe.fuse_lora(components=["transformer", "connectors"], lora_scale=scale, adapter_names=["a"])
    extra: dict[str, Any] = {}
    if image is not None:
        pipe, extra = LTX2ImageToVideoPipeline.from_pipe(pipe), {"image": image}
        pipe.set_progress_bar_config(disable=True)
    return diffusers_call(pipe, **extra)


def diffusers_call(pipe: Any, **arguments: Any) -> Reference:
    """`pipe` (diffusers' LTX-2 pipeline of any class) called as the engine calls the tiny pool: `PROMPT`, `STEPS`
    steps at 64 x 64, `FRAMES` frames at `FPS`, seed 7, the pool's CFG 3, and `arguments` (a class's own inputs)."""
    output = pipe(
        prompt=PROMPT,
        num_inference_steps=STEPS,
        guidance_scale=3.0,
        width=64,
        height=64,
        num_frames=FRAMES,
        frame_rate=float(FPS),
        generator=torch.Generator("cpu").manual_seed(7),
        output_type="pil",
        **arguments,
    )
    return Reference(list(output.frames[0]), output.audio[0].float(), int(pipe.vocoder.config.output_sampling_rate))


def assert_same_video(result: Any, reference: Reference, what: str) -> None:
    """A result's frames within 2 levels of diffusers' (`assert_images_close`), its sound at diffusers' rate and
    within `AUDIO_TOLERANCE` of its samples."""
    assert len(result.frames) == len(reference.frames) == FRAMES
    for index, (ours, theirs) in enumerate(zip(result.frames, reference.frames, strict=True)):
        assert_images_close(pixels(ours), pixels(theirs), f"{what}: frame {index}")
    assert result.audio is not None and result.audio.rate == reference.rate
    assert result.audio.samples.shape == tuple(reference.audio.shape)
    difference = np.abs(result.audio.samples - reference.audio.numpy()).max()
    assert difference <= AUDIO_TOLERANCE, (what, f"audio {difference} apart")
