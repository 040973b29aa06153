"""What a memory plan reads and gives: its options (the settings it reads), each pool's placement (what it keeps
on the device and in host RAM, its denoiser's storage), and the plan, which describes itself for the log.

How a plan is chosen: `engine.pools.plan`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from engine.hostmem import default_host_budget, host_ram
from engine.settings import Settings
from engine.storage import Storage, planned_quantize

__all__ = ["MemoryPlan", "Placement", "PlanOptions", "gib"]


def gib(nbytes: int) -> str:
    """Bytes in GiB, as plans and their refusals say them."""
    return f"{nbytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class PlanOptions:
    """The settings a plan reads."""

    pristine_bytes: int | None  # None: each pool's touchable weights
    pristine_store: str
    offload: bool
    adapter_cache: int
    # What the plan may place in host RAM (None: no bound), and each pool's adapter cache there.
    host_ram: int | None = None
    host_cache: int = 0
    # COMPILE=reduce-overhead: each pool's CUDA graphs keep a memory pool of their own.
    graphs: bool = False
    # QUANTIZE (off, fp8, int4, auto) for every pool, and the pools that are told otherwise: (pool name, value;
    # `gguf` for a pool whose MODELS item names a GGUF file: its storage is the file's).
    quantize: str = "auto"
    pool_quantize: tuple[tuple[str, str], ...] = ()
    # LORA_MAX_RANK, the rank quantized denoisers' branch buffers are sized to (0: not known here).
    rank: int = 0
    # Step sharing (DEVICE_SHARING): each pool's paused run keeps its state on the device (`PoolNeed.paused`).
    step_sharing: bool = False

    def quantize_of(self, name: str) -> str:
        return dict(self.pool_quantize).get(name, self.quantize)

    def keeping(self, storages: Iterable[tuple[str, str]]) -> PlanOptions:
        """These options with each pool's storage fixed as given, (pool name, storage): the plan again, once
        loaded, over the storages the pools loaded in."""
        # A GGUF pool is planned in its own storage (`planned_quantize`): its denoiser measured as loaded.
        fixed = tuple((name, planned_quantize(storage)) for name, storage in storages)
        return replace(self, pool_quantize=fixed)

    @classmethod
    def of(cls, settings: Settings) -> PlanOptions:
        host = settings.host_ram_bytes if settings.host_ram_bytes is not None else default_host_budget(host_ram())
        return cls(
            settings.pristine_bytes,
            settings.pristine_store,
            settings.pool_offload,
            settings.device_cache_bytes,
            host_ram=host,
            host_cache=settings.host_cache_bytes,
            graphs=settings.compile == "reduce-overhead",
            quantize=settings.quantize,
            rank=settings.lora_max_rank,
            # The plan is made for a persistent CUDA device only, where `auto` shares it step by step.
            step_sharing=settings.device_sharing in ("auto", "step"),
            pool_quantize=tuple(
                (p.base_model_id, "gguf" if p.gguf is not None else p.quantize or settings.quantize)
                for p in settings.pool_settings
                if p.quantize or p.gguf is not None
            ),
        )


@dataclass(frozen=True)
class Placement:
    """One pool in a plan: the weights it keeps on the device, what its pristine copies may take there (0: in host
    RAM), the components left in host RAM, its scratch buffers on the device; what it holds in host RAM and its
    pristine copies' budget there; its denoiser's weight storage (`native`, or `fp8` with LoRA branches)."""

    name: str
    weights: int
    pristine: int
    host_components: tuple[str, ...] = ()
    scratch: int = 0
    host_bytes: int = 0
    host_pristine: int = 0
    storage: Storage = "native"
    # A GGUF denoiser's tensor types (`PoolNeed.quant`).
    quant: str = ""

    @property
    def stored_as(self) -> str:
        """The denoiser's storage as plans say it: `int4`, `gguf Q4_K`."""
        return f"{self.storage} {self.quant}" if self.quant else self.storage

    @property
    def nbytes(self) -> int:
        """What the pool holds on the device while it is there."""
        return self.weights + self.pristine + self.scratch

    @property
    def pristine_store(self) -> str:
        return "device" if self.pristine else "cpu"


@dataclass(frozen=True)
class MemoryPlan:
    """A plan that fits: the device's memory, the room for pipelines, each pool's placement, and whether the
    pools all stay resident or take turns."""

    total: int
    room: int
    placements: tuple[Placement, ...]
    resident: bool
    # A smaller PRISTINE_BYTES with which every pool would stay resident with its pristine copies on the device.
    smaller_pristine: int | None = None
    # What the plan may place in host RAM (None: no bound).
    host_budget: int | None = None
    # The pools QUANTIZE=auto stores quantized (fp8, else int4), because the pools fit no other way.
    auto_quantized: tuple[str, ...] = ()

    def placement(self, name: str) -> Placement:
        return next(p for p in self.placements if p.name == name)

    def storage(self, name: str) -> Storage:
        """Pool `name`'s denoiser storage: `native`, or `fp8` or `int4` (quantized, LoRAs as branches beside it)."""
        return self.placement(name).storage

    @property
    def storages(self) -> tuple[tuple[str, Storage], ...]:
        """Each pool's name and denoiser storage."""
        return tuple((p.name, p.storage) for p in self.placements)

    def host_components(self, name: str) -> tuple[str, ...]:
        """The components pool `name` must keep (and run) in host RAM: its loading is told so."""
        return self.placement(name).host_components

    def describe(self) -> str:
        pools = "; ".join(
            f"{p.name} {gib(p.weights)}"
            + (f" (denoiser in {p.stored_as} with LoRA branches)" if p.storage != "native" else "")
            + (f" + {gib(p.pristine)} pristine copies" if p.pristine else "")
            + (f" (pristine copies in host RAM, up to {gib(p.host_pristine)})" if p.host_pristine else "")
            + (f", {' and '.join(p.host_components)} in host RAM" if p.host_components else "")
            for p in self.placements
        )
        mode = "all resident" if self.resident else "taking turns (POOL_OFFLOAD)"
        hint = (
            f" (PRISTINE_BYTES={self.smaller_pristine // 2**20}MiB would keep every pool resident with its pristine "
            "copies on the device; a LoRA set touching more weights is then refused)"
            if self.smaller_pristine is not None
            else ""
        )
        host = "" if self.host_budget is None else f"; host RAM {gib(self.host_bytes)} of {gib(self.host_budget)}"
        auto = (
            f"; QUANTIZE=auto stores {' and '.join(f'{n} in {self.storage(n)}' for n in self.auto_quantized)}, "
            "the only way the pools fit"
            if self.auto_quantized
            else ""
        )
        return f"{gib(self.room)} of {gib(self.total)} for pipelines, {mode}: {pools}{hint}{host}{auto}"

    @property
    def host_bytes(self) -> int:
        """What the plan places in host RAM at most."""
        return sum(p.host_bytes for p in self.placements)
