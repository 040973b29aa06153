"""One pool's weights as views of one flat buffer, so moving the pool is one copy at the floor of copying bytes.

Every parameter and buffer of a pool's modules is a view into one flat byte buffer at an aligned offset;
moving the pool copies the bytes in one go and re-points each tensor (`tensor.data = view`), so the Parameter
objects the swap's tables and pristine copies hold stay the same and every byte arrives as it left. The host
buffer lives as long as the pool (pinned on CUDA). Written here because no library does this for a resident
pipeline (`vector_to_parameters` takes one dtype and concatenates per call; diffusers' group offloading streams
blocks per forward). Why (1,680 tensors in SDXL's UNet): docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["FlatWeights", "module_bytes", "module_tensors"]

# Each tensor starts at a multiple of this many bytes: the CUDA caching allocator's own block granularity, so a
# view is aligned as a tensor of its own would be (vectorised kernels, and CPU kernels whose reduction order
# depends on alignment, see the same addresses modulo 512 as after a plain copy).
_ALIGN = 512


def module_tensors(modules: Iterable[nn.Module]) -> Iterator[torch.Tensor]:
    """Every parameter and buffer of `modules`, each once (tied weights are one tensor)."""
    seen: set[int] = set()
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield tensor


def module_bytes(modules: Iterable[nn.Module]) -> int:
    """Bytes of every parameter and buffer of `modules` (shared tensors once)."""
    return sum(t.nbytes for t in module_tensors(modules))


@dataclass(frozen=True)
class _Layout:
    """Where each tensor lives in the flat buffer: `tensors[i]` at byte `offsets[i]`, `size` bytes in all."""

    tensors: tuple[torch.Tensor, ...]
    offsets: tuple[int, ...]
    size: int

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> _Layout:
        offsets, end = [], 0
        for tensor in tensors:
            offsets.append(end)
            end += -(-tensor.nbytes // _ALIGN) * _ALIGN
        return cls(tuple(tensors), tuple(offsets), end)


def _view(flat: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """`like`'s place in `flat` (uint8), as a contiguous tensor of its dtype and shape."""
    return flat[offset : offset + like.nbytes].view(like.dtype).view(like.shape)


class FlatWeights:
    """The parameters and buffers of one pool's modules, held as views of one flat buffer (host or device).

    Not thread-safe: `engine.pools.residency.Residency` moves a pool under its own lock, never while in use.
    """

    def __init__(self, modules: Sequence[nn.Module], *, pin: bool) -> None:
        self._modules = list(modules)
        self._pin = pin
        self._layout = _Layout.of(list(module_tensors(self._modules)))
        self._shapes = tuple((t.shape, t.dtype) for t in self._layout.tensors)
        # The kept host buffer, allocated the first time the pool goes to host RAM.
        self._host: torch.Tensor | None = None
        # The buffer the tensors were last pointed into (host or device); None before the first move.
        self._flat: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors themselves (the buffers are larger by the alignment padding only)."""
        return sum(t.nbytes for t in self._layout.tensors)

    @property
    def host_buffer(self) -> torch.Tensor:
        """The kept host buffer (allocated by the first `to_host`): read it, never write it (`bench.pools` copies it
        as the floor of a move)."""
        if self._host is None:
            raise ValueError("the pool has not been in host RAM yet; accepted: after `to_host`")
        return self._host

    @torch.no_grad()
    def to_device(self, device: torch.device) -> int:
        """Copy every tensor into one new flat buffer on `device` and point it there; returns the bytes copied."""
        self._relayout()
        target = torch.empty(self._layout.size, dtype=torch.uint8, device=device)
        return self._copy_into(target)

    @torch.no_grad()
    def to_host(self) -> int:
        """Copy every tensor into the kept host buffer and point it there; returns the bytes copied."""
        self._relayout()
        if self._host is None:
            self._host = torch.empty(self._layout.size, dtype=torch.uint8, pin_memory=self._pin)
        return self._copy_into(self._host)

    def _copy_into(self, target: torch.Tensor) -> int:
        tensors, offsets = self._layout.tensors, self._layout.offsets
        source = self._flat
        intact = source is not None and self._intact(source)
        if intact and source is target:
            return 0
        if intact and source is not None:
            # The whole pool in one copy: from pinned host memory this runs at the link's full speed.
            target.copy_(source, non_blocking=True)
        else:
            for tensor, offset in zip(tensors, offsets, strict=True):
                _view(target, offset, tensor).copy_(tensor, non_blocking=True)
        for device in {t.device for t in (target, source) if t is not None and t.device.type == "cuda"}:
            # The copies above are asynchronous: neither the old buffer may be freed nor the new one read before.
            torch.cuda.synchronize(device)
        for tensor, offset in zip(tensors, offsets, strict=True):
            tensor.data = _view(target, offset, tensor)
        self._flat = target
        return self._layout.size

    def _intact(self, flat: torch.Tensor) -> bool:
        """Every tensor is still the view of `flat` it was given (so one copy of `flat` moves them all)."""
        base = flat.data_ptr()
        return all(
            t.data_ptr() == base + offset and t.is_contiguous()
            for t, offset in zip(self._layout.tensors, self._layout.offsets, strict=True)
        )

    def _relayout(self) -> None:
        """Lay the tensors out again when the modules' tensors changed since the last move."""
        current = list(module_tensors(self._modules))
        shapes = tuple((t.shape, t.dtype) for t in current)
        same = len(current) == len(self._layout.tensors) and all(
            a is b for a, b in zip(current, self._layout.tensors, strict=True)
        )
        if same and shapes == self._shapes:
            return
        self._layout = _Layout.of(current)
        self._shapes = shapes
        self._flat = None
        # A new buffer for the new layout: tensors still viewing the old one keep it alive until copied out of it.
        self._host = None
