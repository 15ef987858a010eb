"""Picking the accelerator a node trains and quantizes on."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(spec: str) -> torch.device:
    """``auto`` takes CUDA, then MPS, then the CPU; anything else must be available.

    Raises:
        ValueError: the device is unknown or not available on this machine.
    """
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {spec!r}: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} asked for, but this torch sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' asked for, but MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {spec!r}; use auto, cpu, cuda[:N] or mps")
    return device
