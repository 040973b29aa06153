"""GGUF storage for a pool's denoiser: the blocks of a GGUF file (city96's FLUX.1 files, QuantStack's Qwen-Image
ones, ...) kept as read, with a low-rank branch beside each linear that carries the pool's LoRAs, as on fp8 pools
(`engine.weights.quantized`, `engine.weights.branches`): the stored blocks are never written.

Loading is diffusers': `from_single_file(..., quantization_config=GGUFQuantizationConfig(compute_dtype=...))`
reads the file (in the original key names, converted as diffusers converts them, or already in diffusers'), with
the config of the base's own denoiser (MODEL's `<denoiser>/config.json`), beside the pipeline's other components.
Each of its `GGUFLinear`s then becomes a `GGUFBranchedLinear`: the same raw blocks (uint8) as its weight, widened
at each call by diffusers' own dequantization functions (`dequantize_functions`, to float16 as diffusers widens
them, then to the compute dtype: diffusers' `GGUFLinear.forward_native` bit for bit), plus the branch. Linears the
file stores unquantized (F32, F16) keep their weight in the compute dtype, with a branch like the others.

Refused at start-up with a SettingsError naming the accepted form: a source not of `MODELS`' GGUF forms, a local
path outside GGUF_DIR, a file GGUFReader cannot read (truncated, corrupt), a tensor in a quant type no diffusers
dequantizer reads, and a file whose tensors are not the base denoiser's (names or shapes).
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import SettingsError
from engine.weights.quantized import BranchedLinear

__all__ = [
    "GGUFBranchedLinear",
    "branch_gguf_denoiser",
    "check_gguf_file",
    "gguf_quant_types",
    "load_gguf_denoiser",
    "planned_gguf_types",
    "resolve_gguf_source",
    "served_types",
    "stored_values",
]

logger = logging.getLogger(__name__)

# Tensor types read as plain tensors (diffusers' `load_gguf_checkpoint` keeps these unquantized).
_PLAIN = ("F32", "F16")


class GGUFBranchedLinear(BranchedLinear):
    """A linear whose weight is a GGUF tensor's raw blocks (uint8, rows x bytes), widened per call by diffusers'
    dequantizer for `quant_type`, with `BranchedLinear`'s zero-padded low-rank branch beside it."""

    def __init__(self, linear: nn.Linear, rank: int, dtype: torch.dtype) -> None:
        import gguf
        from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES

        weight = linear.weight
        blocks = weight.as_tensor() if hasattr(weight, "as_tensor") else weight
        plain = nn.Linear(linear.in_features, linear.out_features, bias=False, device="meta")
        super().__init__(plain, rank, dtype, quantize=False)
        # `BranchedLinear` registered the meta weight: the raw blocks replace it (uint8, never a float parameter).
        self.weight = blocks.detach().view(torch.uint8)
        self.weight_scale = torch.empty(0, dtype=torch.float32, device=blocks.device)
        self.bias = linear.bias
        for name in ("lora_down", "lora_up", "lora_scales"):
            setattr(self, name, torch.zeros_like(getattr(self, name), device=blocks.device))
        self.quant_type = gguf.GGMLQuantizationType(weight.quant_type)  # type: ignore[attr-defined]
        self.block_size, self.type_size = GGML_QUANT_SIZES[self.quant_type]
        self._bits_fit = False  # the eager CPU path widens fp8 bits; these are GGUF blocks

    @property
    def quant_name(self) -> str:
        return self.quant_type.name

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The stored weight in `dtype`: diffusers' `dequantize_gguf_tensor` (float16 for GGUF's half scales),
        then cast, as its `GGUFLinear` widens it."""
        from diffusers.quantizers.gguf.utils import dequantize_functions

        blocks = self.weight.reshape(-1, self.type_size)
        widened = dequantize_functions[self.quant_type](blocks, self.block_size, self.type_size)
        return widened.reshape(self.out_features, self.in_features).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.dequantized(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if torch.compiler.is_compiling():
            # The padded rank, whose shapes no swap changes: a swap never recompiles.
            down, up, scales = self.lora_down, self.lora_up, self.lora_scales
        elif self.branch_rank:
            # Eager: only the ranks held (a Python int, read with no device sync).
            rank = self.branch_rank
            down, up, scales = self.lora_down[:rank], self.lora_up[:, :rank], self.lora_scales[:rank]
        else:
            return base
        return base + F.linear(F.linear(x, down) * scales, up)


def resolve_gguf_source(source: str, gguf_dir: Path | None, token: str | None) -> Path:
    """The local file `source` names (a `MODELS` GGUF: `owner/repo/path.gguf` on the Hub, downloaded once into
    its cache; or an absolute path, which must lie under `gguf_dir`, symlinks resolved)."""
    if source.startswith("/"):
        path = Path(source).resolve()
        allowed = gguf_dir.resolve() if gguf_dir is not None else None
        if allowed is None or not path.is_relative_to(allowed):
            where = f"under GGUF_DIR={str(gguf_dir)!r}" if gguf_dir is not None else "under GGUF_DIR (unset)"
            raise SettingsError(
                f"GGUF file {source!r} is outside the allowed places; accepted: an absolute path {where}, "
                "or a Hub file OWNER/REPO/PATH.gguf"
            )
        if not path.is_file():
            raise SettingsError(f"GGUF file {source!r} does not exist; accepted: an existing .gguf file under GGUF_DIR")
        return path
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    owner, repo, filename = source.split("/", 2)
    try:
        return Path(hf_hub_download(f"{owner}/{repo}", filename, token=token))
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise SettingsError(
            f"GGUF file {source!r} could not be fetched ({e}); accepted: a Hub file OWNER/REPO/PATH.gguf that exists"
        ) from e


def _tensors(path: Path) -> list[Any]:
    """The file's tensors as GGUFReader reads its header (the file is mapped, no tensor data read); SettingsError
    for a file it cannot read (truncated, corrupt)."""
    import gguf

    try:
        return list(gguf.GGUFReader(path).tensors)
    except (ValueError, OSError, IndexError, KeyError, EOFError) as e:
        raise SettingsError(
            f"GGUF file {path.name!r} cannot be read ({type(e).__name__}: {e}); accepted: a complete GGUF file "
            "(a truncated or corrupt download: fetch it again)"
        ) from e


def check_gguf_file(path: Path) -> Counter[str]:
    """The file's tensor types (name -> count) once GGUFReader reads it whole and every type is one diffusers
    dequantizes; SettingsError otherwise (a truncated or corrupt file, an unknown or unread quant type)."""
    import gguf
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    types = [tensor.tensor_type for tensor in _tensors(path)]
    accepted = [gguf.GGMLQuantizationType(t).name for t in SUPPORTED_GGUF_QUANT_TYPES]
    read = set(accepted) | set(_PLAIN)
    names = Counter(gguf.GGMLQuantizationType(t).name for t in types)
    refused = sorted(set(names) - read)
    if refused:
        raise SettingsError(
            f"GGUF file {path.name!r} holds tensors of type {', '.join(refused)}, which no diffusers dequantizer "
            f"reads; accepted: {', '.join(sorted(read))}"
        )
    return names


def stored_values(path: Path) -> Counter[str]:
    """The values the file stores in each tensor type (`{"Q4_K": n, "F32": m}`), from its header alone: what the
    memory plan sizes a GGUF pool by before loading (`engine.storage.gguf_bytes`)."""
    import gguf

    counts: Counter[str] = Counter()
    for tensor in _tensors(path):
        counts[gguf.GGMLQuantizationType(tensor.tensor_type).name] += int(tensor.n_elements)
    return counts


def served_types() -> tuple[str, ...]:
    """The block types diffusers dequantizes (`SUPPORTED_GGUF_QUANT_TYPES`, BF16 aside), fewest bits last: the
    types a refusal may name for a GGUF pool that does not fit."""
    import gguf
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    blocks = {gguf.GGMLQuantizationType(t).name: gguf.GGML_QUANT_SIZES[t] for t in SUPPORTED_GGUF_QUANT_TYPES}
    return tuple(sorted((n for n, b in blocks.items() if b[0] > 1), key=lambda n: -blocks[n][1] / blocks[n][0]))


def named_type(filename: str) -> str | None:
    """The tensor type a GGUF file's name says (`flux1-dev-Q4_K_S.gguf`: Q4_K; `...-Q8_0.gguf`: Q8_0), where it
    names exactly one type diffusers reads (or F16/BF16/F32); None otherwise."""
    import gguf
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

    stem = Path(filename).name.upper()
    names = {gguf.GGMLQuantizationType(t).name for t in SUPPORTED_GGUF_QUANT_TYPES} | set(_PLAIN)
    said = {n for n in names if re.search(rf"(?<![A-Z0-9]){re.escape(n)}(?![0-9])", stem)}
    # `Q4_K` and `IQ4_XS`' lookbehind aside, a longer name holding a shorter one (BF16, F16) is the longer.
    said = {n for n in said if not any(n != m and n in m for m in said)}
    return next(iter(said)) if len(said) == 1 else None


def planned_gguf_types(source: str, gguf_dir: Path | None) -> Counter[str] | str | None:
    """What the memory plan sizes a `MODELS` GGUF file by before anything loads: a local file's values per tensor
    type, from its header (SettingsError for a path outside GGUF_DIR or a file that cannot be read); a Hub file's
    from its header where it is in the Hub cache already, else the type its name says (`named_type`); None where
    neither tells (the pool is then planned once loaded, measured)."""
    if source.startswith("/"):
        return stored_values(resolve_gguf_source(source, gguf_dir, None))
    from huggingface_hub import try_to_load_from_cache

    owner, repo, filename = source.split("/", 2)
    cached = try_to_load_from_cache(f"{owner}/{repo}", filename)
    if isinstance(cached, str):
        return stored_values(Path(cached))
    return named_type(filename)


def load_gguf_denoiser(path: Path, model_class: Any, config: str | Any, subfolder: str, dtype: torch.dtype) -> Any:
    """The denoiser `model_class` from GGUF file `path` by diffusers' `from_single_file` with GGUF quantization,
    computing in `dtype`; its config from `config` (a Hub id or a local diffusers folder, at `subfolder`; or a
    model whose config is written to a temporary folder: a tiny pipeline built in memory). SettingsError when
    the file's tensors are not that denoiser's."""
    from diffusers import GGUFQuantizationConfig

    quantization = GGUFQuantizationConfig(compute_dtype=dtype)
    with tempfile.TemporaryDirectory() as folder:
        if not isinstance(config, str):
            config.save_config(Path(folder) / subfolder)
            config = folder
        try:
            model = model_class.from_single_file(
                str(path), config=config, subfolder=subfolder, quantization_config=quantization, torch_dtype=dtype
            )
        except (KeyError, ValueError, RuntimeError, IndexError, AttributeError, TypeError) as e:
            why = _missing_names(path, model_class, config, subfolder) or f"{type(e).__name__}: {e}"
            raise _not_the_base(path, model_class, why) from e
    missing = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    if missing:
        raise _not_the_base(path, model_class, f"it lacks {', '.join(missing[:5])}")
    return model


def _missing_names(path: Path, model_class: Any, config: str, subfolder: str) -> str:
    """Where a file in diffusers' own names lacks some of the denoiser's tensors (diffusers then tries its
    converter for the original names, whose error says nothing of them): which; "" for a file in other names."""
    import gguf

    with torch.device("meta"):
        expected = set(model_class.from_config(model_class.load_config(config, subfolder=subfolder)).state_dict())
    found = {tensor.name for tensor in gguf.GGUFReader(path).tensors}
    missing = sorted(expected - found)
    if not missing or len(found & expected) < len(expected) // 2:
        return ""
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    named = f"of the denoiser's {len(expected)} tensors (the file uses diffusers' names)"
    return f"it lacks {', '.join(missing[:5])}{more} {named}"


def _not_the_base(path: Path, model_class: Any, why: str) -> SettingsError:
    return SettingsError(
        f"GGUF file {path.name!r} does not fit this base's denoiser ({model_class.__name__}): {why}"[:1500]
        + f"; accepted: a GGUF of the base's own {model_class.__name__}, in its original or diffusers key names"
    )


@torch.no_grad()
def branch_gguf_denoiser(
    denoiser: nn.Module, *, rank: int, dtype: torch.dtype, keep: Sequence[str] = ()
) -> dict[str, BranchedLinear]:
    """Replace every linear of `denoiser` (as diffusers loaded it from a GGUF file) by a branched one of rank
    `rank` in `dtype`: a `GGUFBranchedLinear` over each quantized weight's blocks, a `BranchedLinear` keeping
    each unquantized weight (F32/F16 in the file) in `dtype`; those whose name matches a pattern of `keep`
    (`re.search`: linears whose weight dtype diffusers reads, `FamilySpec.keep_dtype_linears`) widened once, in
    `dtype`, where the file quantized them. Returns them by module name."""
    names = [name for name, module in denoiser.named_modules() if isinstance(module, nn.Linear)]
    kept = [re.compile(pattern) for pattern in keep]
    branched: dict[str, BranchedLinear] = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = denoiser.get_submodule(parent_name)
        linear = getattr(parent, child)
        if hasattr(linear.weight, "quant_type"):
            stored = GGUFBranchedLinear(linear, rank, dtype)
            widen = any(pattern.search(name) for pattern in kept)
            branched[name] = BranchedLinear(_widened(stored, dtype), rank, dtype, quantize=False) if widen else stored
        else:
            branched[name] = BranchedLinear(linear, rank, dtype, quantize=False)
        setattr(parent, child, branched[name])
    _widen_the_rest(denoiser, dtype)
    types = gguf_quant_types(denoiser)
    logger.info("denoiser from GGUF: %d linears (%s), branches of rank %d", len(branched), types, rank)
    return branched


def _widen_the_rest(denoiser: nn.Module, dtype: torch.dtype) -> None:
    """Quantized tensors of no linear (a pad token a file stored in blocks) widened once, in `dtype`: diffusers
    would hand their blocks to torch ops as values."""
    from diffusers.quantizers.gguf.utils import dequantize_gguf_tensor

    for module in denoiser.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if hasattr(param, "quant_type"):
                widened = dequantize_gguf_tensor(param).to(dtype)
                module._parameters[name] = nn.Parameter(widened.as_subclass(torch.Tensor), requires_grad=False)


def _widened(linear: GGUFBranchedLinear, dtype: torch.dtype) -> nn.Linear:
    plain = nn.Linear(linear.in_features, linear.out_features, bias=False, device="meta")
    plain.weight = nn.Parameter(linear.dequantized(dtype), requires_grad=False)
    plain.bias = linear.bias
    return plain


def gguf_quant_types(denoiser: nn.Module) -> str:
    """The quant types of `denoiser`'s GGUF linears, most values first, e.g. `Q4_K (312), Q6_K (24)`."""
    counts: Counter[str] = Counter()
    for module in denoiser.modules():
        if isinstance(module, GGUFBranchedLinear):
            counts[module.quant_name] += 1
    return ", ".join(f"{name} ({count})" for name, count in counts.most_common()) or "none quantized"
