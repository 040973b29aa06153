"""What each pool needs on the device, for the memory plan (`engine.pools.plan`): from its family's declared sizes
before loading, or measured on the loaded pipeline; in each weight storage its denoiser may take.

A need in `native` storage carries its `fp8` and `int4` alternatives where the size is known (`engine.storage`'s
formula). A GGUF pool's need is its file's storage alone (its `MODELS` item chose it, the plan never changes it):
sized before loading by the file's tensor types (`engine.weights.gguf.planned_gguf_types`: a local file's header, a
Hub file's name or cached header), measured once loaded. Each is: the denoiser quantized, with LoRA branch buffers
at `LORA_MAX_RANK` and no pristine copies of its own (a LoRA never writes it: only the text encoders' remain
touchable, and the swap's float32 scratch is sized to their largest weight); its working memory adds the weight its
formula widens at each call (`dequantized_bytes`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from engine.families.registry import family_spec
from engine.families.spec import MemorySpec
from engine.pipeline.loading import LoadedPipeline, resolve_dtype
from engine.pools.flat import module_bytes
from engine.settings import Settings
from engine.storage import (
    BRANCHED,
    GGUF_PLAIN,
    Storage,
    branch_bytes,
    fp8_bytes,
    gguf_bytes,
    int4_bytes,
    linear_sizes,
)
from engine.weights.gguf import planned_gguf_types, served_types
from engine.weights.quantized import DEQUANTIZED_COPIES

__all__ = [
    "PoolNeed",
    "declared_needs",
    "dequantized_bytes",
    "largest_values",
    "loaded_need",
    "paused_bytes",
    "pipeline_modules",
    "scratch_bytes",
]

# The swap's float32 scratch slots (engine.formats.layers.Scratch), each as large as the largest touched weight.
_SCRATCH_SLOTS = 5
# A paused run's latent-sized float32 tensors: the latents, the guidance's two predictions, a sampler's history
# (UniPC keeps up to three model outputs).
_PAUSED_COPIES = 6
# A paused run's prompt embeddings, at most: UMT5/T5's 512 tokens × 4096 in bf16, with and without the prompt.
_EMBEDDING_BYTES = 16 * 2**20


@dataclass(frozen=True)
class PoolNeed:
    """What one pool would hold on the device: all its weights, those a LoRA may touch, and those its family may
    leave in host RAM (by component); what its inference needs free beside them; its denoiser's storage, and the
    same pool with its denoiser in fp8 (`fp8`, None where not known or already so)."""

    name: str
    weights: int
    touchable: int
    host_able: tuple[tuple[str, int], ...] = ()
    working: int = MemorySpec().working_bytes
    # The swap's float32 scratch buffers on the device while the pool is there.
    scratch: int = 0
    storage: Storage = "native"
    fp8: PoolNeed | None = None
    # The same pool with its denoiser in int4 (None where not known or already so).
    int4: PoolNeed | None = None
    # A GGUF denoiser's tensor types, most values first (`Q4_K`, `Q4_K, Q6_K`); "" for any other storage.
    quant: str = ""
    # A GGUF pool with every Linear in each served type of fewer bits than its file's, fewest last (what a refusal
    # may name; known before loading only).
    smaller: tuple[PoolNeed, ...] = ()
    # A quantized denoiser's LoRA branch buffers at `LORA_MAX_RANK`, in `weights` (what a smaller rank saves).
    branches: int = 0
    # What one paused run of this pool keeps on the device with step sharing (`paused_bytes`).
    paused: int = 0

    def with_fp8(self, denoiser: int, quantized: int, scratch: int, widened: int, branches: int = 0) -> PoolNeed:
        """This need with its fp8 alternative: the denoiser's `denoiser` bytes (native) held in `quantized` bytes
        (fp8, branch buffers included) and no longer touchable, the swap's scratch `scratch` bytes (for the text
        encoders' weights only), and `widened` bytes more working memory (`dequantized_bytes`); `branches` of the
        `quantized` bytes are its LoRA branch buffers."""
        weights, touchable = self.weights - denoiser + quantized, self.touchable - denoiser
        working = self.working + widened
        fp8 = replace(self, weights=weights, touchable=touchable, working=working, scratch=scratch, storage="fp8")
        fp8 = replace(fp8, branches=branches)
        return replace(self, fp8=replace(fp8, fp8=None, int4=None))

    def with_int4(self, denoiser: int, quantized: int, scratch: int, widened: int, branches: int = 0) -> PoolNeed:
        """This need with its int4 alternative, as `with_fp8` makes the fp8 one (`quantized`: int4 bytes)."""
        alternative = self.with_fp8(denoiser, quantized, scratch, widened, branches).fp8
        assert alternative is not None  # with_fp8 always makes one
        return replace(self, int4=replace(alternative, storage="int4"))

    def with_gguf(
        self, denoiser: int, stored: int, scratch: int, widened: int, quant: str, branches: int = 0
    ) -> PoolNeed:
        """The same pool with its denoiser (`denoiser` bytes native) read from a GGUF file of types `quant` into
        `stored` bytes (branch buffers included), as `with_fp8` makes the fp8 one: the pool's only storage."""
        alternative = self.with_fp8(denoiser, stored, scratch, widened, branches).fp8
        assert alternative is not None  # with_fp8 always makes one
        return replace(alternative, storage="gguf", quant=quant)

    def saves(self, storage: Storage) -> int:
        """What storing its denoiser in `storage` saves on the device at most, pristine copies included (0 where
        unknown)."""
        other = {"fp8": self.fp8, "int4": self.int4}.get(storage)
        if other is None:
            return 0
        return self.weights + self.scratch + self.touchable - (other.weights + other.scratch + other.touchable)

    @property
    def fp8_saves(self) -> int:
        """What storing its denoiser in fp8 saves on the device at most, pristine copies included (0 where
        unknown; below 0 where the branch buffers outweigh it, as on a tiny pipeline)."""
        return self.saves("fp8")


def pipeline_modules(loaded: LoadedPipeline) -> list[nn.Module]:
    """The pipeline's modules that hold weights and live on the device (what moves between it and host RAM)."""
    return [
        m for c, m in loaded.pipe.components.items() if isinstance(m, nn.Module) and c not in loaded.host_components
    ]


def paused_bytes(memory: MemorySpec) -> int:
    """What one paused run keeps on the device with step sharing (`engine.pipeline.stepshare`), from the latent
    shape of the family's largest request: a video's `video_size` ((frames - 1) / 4 + 1 latent frames of 16
    channels at an eighth of each side: Wan's VAE), an image's `largest_side` (2048 when not declared) at 32
    channels (FLUX.2's; SDXL's 4 and FLUX.1's 16 are fewer); the latents, the guidance's two predictions and a
    multistep sampler's history in float32 (`_PAUSED_COPIES`), and its prompt embeddings (`_EMBEDDING_BYTES`);
    where a run pauses inside its denoiser's forward, between two blocks (Wan: `FamilySpec.denoiser_blocks`, so
    that an image waits one block, not a whole guidance pass), also what that forward holds there, its hidden
    states (tokens × inner width × dtype, from the same latent shape: `MemorySpec.midpass_bytes`), for the run is
    paused mid-forward with them alive on its thread's stack."""
    if memory.video_size:
        frames, width, height = memory.video_size
        values = 16 * ((frames - 1) // 4 + 1) * (height // 8) * (width // 8)
    else:
        side = memory.largest_side or 2048
        values = 32 * (side // 8) ** 2
    return values * 4 * _PAUSED_COPIES + _EMBEDDING_BYTES + memory.midpass_bytes


def scratch_bytes(largest_values: int) -> int:
    """The swap's float32 scratch buffers for a pool whose largest touchable weight has `largest_values` values."""
    return _SCRATCH_SLOTS * 4 * largest_values


def dequantized_bytes(largest_linear: int, dtype: torch.dtype) -> int:
    """What an fp8 denoiser's formula holds at once beside the working memory, eager on a GPU: its largest Linear
    weight (`largest_linear` values) widened to the compute `dtype`, `DEQUANTIZED_COPIES` times (a transient
    copy at each call, freed after the matmul)."""
    return DEQUANTIZED_COPIES * largest_linear * torch.empty((), dtype=dtype).element_size()


def largest_values(modules: list[nn.Module]) -> int:
    """The values of the largest Linear/Conv2d weight of `modules` (what a LoRA may touch)."""
    sizes = [m.weight.numel() for module in modules for m in module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    return max(sizes, default=0)


def loaded_need(loaded: LoadedPipeline, *, rank: int, group_size: int = 128) -> PoolNeed:
    """A loaded pipeline's need, measured (without the components already left in host RAM), with its fp8 and int4
    (groups of `group_size`) alternatives at branch rank `rank` (the denoiser measured as loaded, in its native
    storage)."""
    family, pipe = loaded.family, loaded.pipe
    touched = [getattr(pipe, c) for c in family.components if c not in loaded.host_components]
    touchable = module_bytes(touched)
    movable = [c for c in family.memory.host_components if c not in loaded.host_components]
    host_able = tuple((c, module_bytes([getattr(pipe, c)])) for c in movable)
    weights = module_bytes(pipeline_modules(loaded))
    scratch = scratch_bytes(largest_values(touched))
    # Its base's working memory (Wan's 720P bases plan a larger video than their family's reference).
    memory = family.memory_of(loaded.base_model_id)
    need = PoolNeed(loaded.base_model_id, weights, touchable, host_able, memory.working_bytes, scratch)
    need = replace(need, paused=paused_bytes(memory))
    # The stored components (the denoiser; Wan 2.2 A14B's transformer_2 too), which a quantized pool stores.
    stored_modules = [getattr(pipe, c) for c in family.stored]
    linears = linear_sizes(
        (
            (n, m.out_features, m.in_features)
            for module in stored_modules
            for n, m in module.named_modules()
            if isinstance(m, nn.Linear)
        ),
        family.memory.branch_modules,
    )
    values = sum(t.numel() for module in stored_modules for t in (*module.parameters(), *module.buffers()))
    encoders = [getattr(pipe, c) for c in family.components if c not in (*family.stored, *loaded.host_components)]
    encoder_scratch = scratch_bytes(largest_values(encoders))
    widest = max(
        (m.weight.numel() for module in stored_modules for m in module.modules() if isinstance(m, nn.Linear)),
        default=0,
    )
    widened = dequantized_bytes(widest, loaded.dtype)
    stored = module_bytes(stored_modules)
    if loaded.storage == "gguf":
        # Its files' blocks, measured as loaded (branch buffers included): its only storage.
        return need.with_gguf(stored, stored, encoder_scratch, widened, _gguf_types(loaded), _branches(stored_modules))
    if loaded.storage in BRANCHED:
        # Loaded quantized already (fp8 or int4): measured as it is, its branch buffers included.
        quantized = need.with_int4 if loaded.storage == "int4" else need.with_fp8
        return quantized(stored, stored, encoder_scratch, widened, _branches(stored_modules))
    branches = branch_bytes(linears, rank)
    need = need.with_fp8(stored, fp8_bytes(values, linears, rank), encoder_scratch, widened, branches)
    return need.with_int4(stored, int4_bytes(values, linears, rank, group_size), encoder_scratch, widened, branches)


def _gguf_types(loaded: LoadedPipeline) -> str:
    """A GGUF pool's quant types, most first, each once (an A14B's two files' joined: `Q4_K (400); Q4_K (400)`)."""
    said = loaded.gguf_types.replace("; ", ", ").split(", ")
    return ", ".join(dict.fromkeys(t.split(" (")[0] for t in said if t != "none quantized"))


def _branches(modules: list[nn.Module]) -> int:
    """The bytes of loaded quantized components' LoRA branch factors."""
    return sum(t.nbytes for m in modules for n, t in m.named_buffers() if n.endswith(("lora_down", "lora_up")))


def declared_needs(settings: Settings, device: torch.device) -> tuple[PoolNeed, ...] | None:
    """Each pool's need from its family's declared sizes, before loading; None when a pool's are unknown (a tiny
    pipeline, a local folder, a family that declares none, no fp8 size for a pool `QUANTIZE=fp8` quantizes, or a
    GGUF file whose types neither its header nor its name tells)."""
    needs = []
    for pool in settings.pool_settings:
        family = family_spec(pool.base_model_id, setting="BASE_MODEL_ID")
        memory = family.memory_of(pool.base_model_id)
        # Each family's own half precision under DTYPE=auto (FLUX.1: bfloat16), as load_pipeline loads it.
        dtype = resolve_dtype(settings.dtype, device, family.half_dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        # A local folder may hold anything (a tiny pipeline, a pruned one): it is judged once loaded.
        own = settings.for_pool(pool)
        if own.loads_tiny or Path(pool.model_id).exists() or not memory.values:
            return None
        if memory.linears is None and (own.quantize in BRANCHED or own.gguf is not None):
            return None
        types = planned_gguf_types(own.gguf, settings.gguf_dir) if own.gguf is not None else None
        if own.gguf is not None and types is None:
            return None
        host_able = tuple((c, memory.values_of((c,)) * itemsize) for c in memory.host_components)
        weights, touchable = memory.total_values * itemsize, memory.values_of(family.components) * itemsize
        if dtype == torch.float16:
            weights += memory.values_of(memory.float32_in_fp16) * (4 - itemsize)
        scratch = scratch_bytes(memory.largest_values)
        need = PoolNeed(pool.base_model_id, weights, touchable, host_able, memory.working_bytes, scratch)
        need = replace(need, paused=paused_bytes(memory))
        if memory.linears is not None:
            # Every stored component's values (`FamilySpec.stored`: an A14B's two transformers, sized from its
            # first GGUF file's types where it names two); `linears` declares all of theirs.
            need = _quantized(need, memory, memory.values_of(family.stored), dtype, settings, types)
        needs.append(need)
    return tuple(needs)


def _quantized(
    need: PoolNeed,
    memory: MemorySpec,
    values: int,
    dtype: torch.dtype,
    settings: Settings,
    types: Counter[str] | str | None,
) -> PoolNeed:
    """`need` with its fp8 and int4 alternatives (a denoiser of `values` values in `dtype` native);
    a GGUF pool's (`types`: its file's, `planned_gguf_types`) its file's storage instead."""
    assert memory.linears is not None
    rank = settings.lora_max_rank
    # `largest_values` (the largest weight a LoRA may touch, the denoiser's Linears among them) bounds its largest
    # Linear from above.
    widened = dequantized_bytes(memory.largest_values, dtype)
    encoders = scratch_bytes(memory.largest_encoder_values)
    native = values * torch.empty((), dtype=dtype).element_size()
    linears, branches = memory.linears, branch_bytes(memory.linears, rank)
    if types is not None:
        quant = types if isinstance(types, str) else gguf_label(types)
        own = need.with_gguf(native, gguf_bytes(values, linears, rank, types), encoders, widened, quant, branches)
        served = ((t, gguf_bytes(values, linears, rank, t)) for t in served_types())
        alternatives = (need.with_gguf(native, b, encoders, widened, t, branches) for t, b in served)
        return replace(own, smaller=tuple(n for n in alternatives if n.weights < own.weights))
    need = need.with_fp8(native, fp8_bytes(values, linears, rank), encoders, widened, branches)
    int4 = int4_bytes(values, linears, rank, settings.int4_group_size)
    return need.with_int4(native, int4, encoders, widened, branches)


def gguf_label(types: Counter[str]) -> str:
    """A GGUF file's quantized tensor types, most values first (`Q4_K, Q6_K`; `F16` where none is quantized)."""
    quantized = [name for name, _ in types.most_common() if name not in GGUF_PLAIN]
    return ", ".join(quantized) or ", ".join(name for name, _ in types.most_common())
