"""A model's parameters as views into one flat float32 buffer, the vector gossip moves."""

from __future__ import annotations

import torch
from torch import nn

from gossip.messages import ParamSpec

__all__ = ["FlatParams"]


class FlatParams:
    """Rebinds every parameter of ``model`` to a slice of one contiguous buffer.

    Afterwards ``flat`` and the parameters share storage: the optimizer's in-place updates show up
    in ``flat`` and the consensus step's in-place updates show up in the model, with no copies.
    Only parameters are gossiped; buffers (say, batch-norm statistics) stay local.

    Args:
        model: its parameters must be float32 and on one device.
    """

    def __init__(self, model: nn.Module) -> None:
        named = list(model.named_parameters())
        if not named:
            raise ValueError("the model has no parameters to train")
        devices = {p.device for _, p in named}
        if len(devices) != 1:
            raise ValueError(f"parameters live on several devices: {sorted(map(str, devices))}")
        for name, p in named:
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {name} is {p.dtype}; murmur gossips float32 models")
        self.device = devices.pop()
        self.specs = tuple(
            ParamSpec(name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
            for name, p in named
        )
        total = sum(p.numel() for _, p in named)
        self.flat = torch.empty(total, dtype=torch.float32, device=self.device)
        offset = 0
        with torch.no_grad():
            for _, p in named:
                n = p.numel()
                view = self.flat[offset : offset + n].view_as(p)
                view.copy_(p)
                p.data = view
                offset += n

    @property
    def numel(self) -> int:
        return self.flat.numel()
