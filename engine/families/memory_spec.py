"""What a family's pipelines hold, for the start-up memory plan: `MemorySpec`, one field of `FamilySpec`
(`engine.families.spec`), declared apart so that the shape of a family stays readable."""

from __future__ import annotations

from dataclasses import dataclass

from engine.storage import LinearSizes

__all__ = ["MemorySpec"]


@dataclass(frozen=True)
class MemorySpec:
    """What the family's pipelines hold, for the start-up memory plan (`engine.pools.plan`) before anything loads.

    `values`: (pipeline component, its parameter and buffer values) of the family's reference model, from its
    published configs (fine-tunes share them); bytes follow the served dtype. Empty: the plan judges the loaded
    pipeline only. `host_components`: components the family's pipeline can run with their weights in host RAM
    (FLUX's T5 encoder: 9.5 GB in bf16); the plan leaves them there only when the pools fit no other way, and then
    the pool's loading and inference must keep and run them there (`MemoryPlan.host_components`). The UNet
    families have none. `working_bytes`: what inference needs free beside the weights at the family's largest
    sizes (activations, the VAE's decode); the plan keeps the largest of its pools' free. `largest_values`: the
    values of the largest Linear/Conv2d weight a LoRA may touch, which sizes the swap's float32 scratch buffers.
    `float32_in_fp16`: components loading keeps in float32 when the pool runs in float16 (SDXL's `force_upcast`
    VAE: `engine.pipeline.loading`), counted at 4 bytes a value. `linears`: the reference denoiser's Linears as fp8
    storage sizes them (`engine.storage`; None: its fp8 size is known once loaded); `branch_modules`: the pattern
    (`re.search`) of the denoiser's Linear names LoRAs may target, which get LoRA branches on a quantized pool
    (None: every Linear). `largest_encoder_values`: `largest_values` over the components besides the denoiser (the
    swap's scratch on a quantized pool, whose LoRAs fuse into the text encoders only). `video_size`: the (frames,
    width, height) a video family's `working_bytes` is planned at, whose tokens bound every request
    (`ModelDefaults.video_plan`; empty: no bound); `largest_side`: the largest side its pools take (0: twice the
    served side, as every family's), which `working_bytes` covers too (Wan's 720P bases: 1280). `midpass_bytes`:
    what a run paused between two of its denoiser's blocks keeps (`FamilySpec.denoiser_blocks`; 0: none).
    """

    values: tuple[tuple[str, int], ...] = ()
    host_components: tuple[str, ...] = ()
    # SDXL at 1024² peaks at about 3-4 GiB of activations in fp16.
    working_bytes: int = 4 * 2**30
    largest_values: int = 0
    float32_in_fp16: tuple[str, ...] = ()
    linears: LinearSizes | None = None
    branch_modules: str | None = None
    largest_encoder_values: int = 0
    video_size: tuple[int, int, int] | tuple[()] = ()
    largest_side: int = 0
    midpass_bytes: int = 0

    def values_of(self, components: tuple[str, ...]) -> int:
        """The values of `components` (those the spec names)."""
        return sum(n for c, n in self.values if c in components)

    @property
    def total_values(self) -> int:
        return sum(n for _, n in self.values)
