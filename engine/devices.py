"""Comparing devices: `cuda` and `cuda:0` are one device when 0 is the current one.

`torch.device("cuda") == torch.device("cuda:0")` is False, while every CUDA tensor reports its index: a setting's
device (`DEVICE=cuda`, or `auto`) compared with a tensor's with `==` never matches, and a pool already on the GPU
would look absent and be copied in again. Every comparison of a configured device with a tensor's goes through
`same_device`. No index is ever resolved unless both sides are of one accelerator type, so comparing a CPU
tensor with `cuda` never initialises CUDA (ZeroGPU's main process must not).
"""

from __future__ import annotations

import torch

__all__ = ["normal_device", "same_device"]


def normal_device(device: torch.device | str) -> torch.device:
    """`device` with its index made explicit: the current device's for an accelerator, none for the CPU (whose
    tensors report no index)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is not None:
        return device
    if device.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == device.type:
        return torch.device(device.type, torch.accelerator.current_device_index())
    # A device type with no notion of a current index (meta): the type alone names it.
    return device


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether `a` and `b` are one device (`cuda` is `cuda:N` for the current N)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index == b.index:
        return True
    return normal_device(a) == normal_device(b)
