"""What a text encoder left in host RAM costs per prompt: computed on the host's CPU, streamed to the GPU, or cached.

`python -m bench.encode` builds T5-XXL's encoder (FLUX's text_encoder_2: its width, heads and feed-forward from
its config) with `--layers` of its 24 blocks, random weights in bf16, and encodes one `--tokens`-token prompt
(FLUX: 512) three ways, side by side in one run, through the engine's own `run_from_host_ram`:
(a) weights and compute in host RAM (the CPU path); (b) weights in host RAM streamed to the GPU per call
(diffusers' group offloading; CUDA only); (c) the same prompt again, answered by the kept output. The full
encoder's time is scaled from the measured blocks (the blocks are the compute; the embedding is a lookup).
It ends with one line: `encode_host_s=<s> streamed_s=<s|n/a> cached_s=<s> host_vs_cached=<ratio>
host_vs_streamed=<ratio|n/a>` (times for the full 24 blocks).

`python -m bench.encode --references` measures instead what each reference image adds to Qwen-Image-Edit-2509/
2511's prompt encoding (`bench.encode_references`: its own options and `reference_encode:` line).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
from transformers import T5Config, T5EncoderModel

from engine.pipeline.encoders import ENCODER_CACHE_BYTES, run_from_host_ram

# google/t5-v1_1-xxl's encoder as FLUX.1's text_encoder_2/config.json has it.
T5_XXL = {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "vocab_size": 32128, "num_layers": 24}
FULL_LAYERS = T5_XXL["num_layers"]


def build(layers: int, scale: int = 1) -> T5EncoderModel:
    """T5-XXL's encoder with `layers` blocks (every width divided by `scale`, for tests), random bf16 weights."""
    widths = {k: T5_XXL[k] // scale for k in ("d_model", "d_ff", "num_heads")}
    config = T5Config(
        **{**T5_XXL, **widths, "num_layers": layers},
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
    )
    torch.manual_seed(0)
    return T5EncoderModel(config).to(torch.bfloat16).eval()


def _seconds(call: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync()
        started = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def measure(layers: int, tokens: int, repeats: int, scale: int = 1) -> dict[str, float | None]:
    """Seconds per prompt for the full encoder: on the host, streamed (None without CUDA), cached."""
    ids = torch.randint(0, T5_XXL["vocab_size"] // scale, (1, tokens))
    none: Callable[[], None] = lambda: None  # noqa: E731
    factor = FULL_LAYERS / layers

    host_model = build(layers, scale)
    run_from_host_ram(host_model, torch.device("cpu"), cache_bytes=None)
    with torch.inference_mode():
        host = _seconds(lambda: host_model(ids), repeats, none) * factor
    streamed = None
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        stream_model = build(layers, scale)
        run_from_host_ram(stream_model, cuda, cache_bytes=None)
        on_cuda = ids.to(cuda)
        sync = lambda: torch.cuda.synchronize(cuda)  # noqa: E731
        with torch.inference_mode():
            stream_model(on_cuda)  # the first call traces the prefetch order
            streamed = _seconds(lambda: stream_model(on_cuda), repeats, sync) * factor
    cached_model = build(layers, scale)
    run_from_host_ram(cached_model, torch.device("cpu"), cache_bytes=ENCODER_CACHE_BYTES)
    with torch.inference_mode():
        cached_model(ids)  # kept
        # A hit costs keying the inputs and copying the kept output: no block runs, so no scaling.
        cached = _seconds(lambda: cached_model(ids), repeats, none)
    return {"host": host, "streamed": streamed, "cached": cached}


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if "--references" in argv:
        references([a for a in argv if a != "--references"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help=f"blocks built and timed (of {FULL_LAYERS})")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (tests: a tiny encoder)")
    args = parser.parse_args(argv)
    result = measure(args.layers, args.tokens, args.repeats, args.scale)
    host, streamed, cached = result["host"], result["streamed"], result["cached"]
    assert host is not None and cached is not None
    print(
        f"T5-XXL encoder, {args.tokens} tokens, {args.layers} of {FULL_LAYERS} blocks timed and scaled"
        f"{'' if args.scale == 1 else f', widths / {args.scale}'}; torch threads {torch.get_num_threads()}"
    )
    print(
        f"encode_host_s={host:.3f} streamed_s={'n/a' if streamed is None else f'{streamed:.3f}'} "
        f"cached_s={cached:.4f} host_vs_cached={host / cached:.0f} "
        f"host_vs_streamed={'n/a' if streamed is None else f'{host / streamed:.1f}'}"
    )


def references(argv: Sequence[str]) -> None:
    """`--references`: each reference image's encode cost beside the prompt's (`bench.encode_references`)."""
    from bench.encode_references import FULL_TEXT_LAYERS, FULL_VISION_LAYERS, report

    parser = argparse.ArgumentParser(description="each reference image's encode cost (Qwen-Image-Edit-2509/2511)")
    parser.add_argument("--tiny", action="store_true", help="the tiny EditPlus pipeline's own encoder")
    parser.add_argument("--count", type=int, default=3, help="references timed (Qwen's cards: up to 3)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--text-layers", type=int, default=2, help=f"decoder layers built (of {FULL_TEXT_LAYERS})")
    parser.add_argument("--vision-layers", type=int, default=2, help=f"vision blocks built (of {FULL_VISION_LAYERS})")
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    layers = (args.text_layers, args.vision_layers)
    report(args.tiny, args.count, args.repeats, layers, args.scale, args.device)


if __name__ == "__main__":
    main()
