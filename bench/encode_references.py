"""What each reference image costs Qwen-Image-Edit-2509/2511's prompt encoding: Qwen2.5-VL reads every reference
(its vision tower over the picture's patches, then the language model over the picture's tokens beside the
prompt's), so an edit from three references encodes much more than a text prompt.

`python -m bench.encode --references` times the pipeline's own `encode_prompt` (QwenImageEditPlusPipeline's, the
tiny EditPlus pipeline's other parts) with no reference and with `--count` references of 384 x 384 (what the call
resizes each to for the encoder), and reports the cost of one reference beside the prompt alone. `--tiny`: the tiny
pipeline's own encoder and processor (CPU-sized). Otherwise Qwen2.5-VL-7B's widths (its config's, random bf16
weights) with `--text-layers` of its 28 decoder layers and `--vision-layers` of its 32 vision blocks, each part's
measured time scaled to its full depth (the vision tower's time is taken apart by hooks), the real image
processor's resolution (a 384 x 384 picture: 729 patches, 182 tokens); `--scale` divides every width (tests).
It ends with one line: `reference_encode: prompt_s=<s> per_reference_s=<s> per_reference_vs_prompt=<ratio>
vision_share=<fraction of a reference's cost in the vision tower>`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE, calculate_dimensions
from PIL import Image
from transformers import Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from engine.families.qwen_image_edit_plus import build_tiny_pipeline

# Qwen/Qwen-Image-Edit-2509's text_encoder/config.json (Qwen2.5-VL-7B-Instruct).
TEXT = {"hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064}
TEXT_HEADS, KV_HEADS, MROPE_SECTION = 28, 4, (16, 24, 24)
VISION = {"hidden_size": 1280, "intermediate_size": 3420}
VISION_HEADS = 16
FULL_TEXT_LAYERS, FULL_VISION_LAYERS = 28, 32
PROMPT = "the person in image 1 wearing the jacket from image 2, standing in the room of image 3"


def build(tiny: bool, text_layers: int, vision_layers: int, scale: int, device: torch.device) -> Any:
    """The tiny EditPlus pipeline, its encoder replaced by Qwen2.5-VL-7B's widths (unless `tiny`) on `device`."""
    pipe: Any = build_tiny_pipeline()
    if tiny:
        return pipe.to(device)
    config = pipe.text_encoder.config  # the tiny tokenizer's token ids, Qwen2.5-VL's structure
    text, vision = config.text_config, config.vision_config
    # Widths divided by `scale`, head counts kept (the heads narrower, their rotary sections with them).
    for key, value in TEXT.items():
        setattr(text, key, value // scale)
    text.num_attention_heads, text.num_key_value_heads = TEXT_HEADS, KV_HEADS
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [s // scale for s in MROPE_SECTION]}
    text.num_hidden_layers, text.layer_types = text_layers, ["full_attention"] * text_layers
    for key, value in VISION.items():
        setattr(vision, key, value // scale)
    vision.num_heads, vision.out_hidden_size = VISION_HEADS, text.hidden_size
    vision.depth, vision.fullatt_block_indexes = vision_layers, [vision_layers - 1]
    with torch.device(device):
        torch.manual_seed(0)
        encoder = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16).eval()
    pipe.text_encoder = encoder
    pipe.processor.image_processor = Qwen2VLImageProcessorPil()  # the real one's resolution
    pipe.to(device)
    return pipe


def _timed(call: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync()
        started = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def measure(pipe: Any, count: int, repeats: int, factors: tuple[float, float]) -> dict[str, float]:
    """Seconds for the prompt alone and per reference (each part scaled by its `factors`: text, vision)."""
    device = pipe.text_encoder.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    side = calculate_dimensions(CONDITION_IMAGE_SIZE, 1.0)
    pictures = [Image.effect_noise(side, 64 + 32 * i).convert("RGB") for i in range(count)]
    vision = pipe.text_encoder.model.visual
    spent: list[float] = []

    def started(*_: object) -> None:
        sync()
        spent.append(-time.perf_counter())

    def ended(*_: object) -> None:
        sync()
        spent[-1] += time.perf_counter()

    vision.register_forward_pre_hook(started)
    vision.register_forward_hook(ended)
    seconds: dict[int, float] = {}
    in_vision: dict[int, float] = {}
    for k in (0, count):
        spent.clear()
        images = pictures[:k] or None
        with torch.inference_mode():
            total = _timed(lambda i=images: pipe.encode_prompt(PROMPT, image=i, device=device), repeats, sync)
        seen = statistics.median(spent[1:]) if len(spent) > 1 else 0.0  # the warm-up's left out, as in `_timed`
        seconds[k] = (total - seen) * factors[0] + seen * factors[1]
        in_vision[k] = seen * factors[1]
    per = (seconds[count] - seconds[0]) / count
    return {"prompt": seconds[0], "per_reference": per, "vision": in_vision[count] / count}


def report(tiny: bool, count: int, repeats: int, layers: tuple[int, int], scale: int, device: str) -> None:
    pipe = build(tiny, *layers, scale, torch.device(device))
    factors = (1.0, 1.0) if tiny else (FULL_TEXT_LAYERS / layers[0], FULL_VISION_LAYERS / layers[1])
    result = measure(pipe, count, repeats, factors)
    what = "the tiny EditPlus encoder" if tiny else f"Qwen2.5-VL-7B widths{'' if scale == 1 else f' / {scale}'}"
    depth = "" if tiny else f", {layers[0]} of {FULL_TEXT_LAYERS} layers and {layers[1]} of {FULL_VISION_LAYERS} blocks"
    print(f"reference encode: {what}{depth} timed and scaled, {count} references of 384x384, on {device}")
    prompt, per = result["prompt"], result["per_reference"]
    print(
        f"reference_encode: prompt_s={prompt:.4f} per_reference_s={per:.4f} per_reference_vs_prompt={per / prompt:.2f} "
        f"vision_share={result['vision'] / per if per > 0 else 0.0:.2f}"
    )
