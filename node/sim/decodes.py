"""Decoding each delta once for the whole simulated swarm.

A node sends the same delta to all its neighbours; in the daemon each receiver gets its own copy
off the wire and decodes it, but in the simulator every receiver is handed the very same
payload object, so decoding it again per receiver (its checks of the values, the
dequantization) only repeats the same pure computation, and was most of the simulator's time.
:func:`sharing_decodes` gives a codec that keeps, for each payload still alive, what decoding it
gave (and that its geometry passed ``validate``), and hands every receiver a fresh copy of it.
What a receiver checks and applies is otherwise the daemon's code unchanged
(gossip/replicas.py ``receive_delta``): the sender, session and sequence checks, the overflow
check, the replica's update; a payload that fails its checks fails them again each time.
"""

from __future__ import annotations

import weakref
from typing import cast

import torch

from gossip.codecs import Codec, Encoded

__all__ = ["sharing_decodes"]


class _SharedDecodes(Codec):
    """Mixed in before a concrete codec class: its ``decode``, once per payload."""

    _decoded: weakref.WeakKeyDictionary[Encoded, torch.Tensor]
    _valid: weakref.WeakSet[Encoded]

    def validate(self, enc: Encoded) -> None:
        if enc not in self._valid:
            super().validate(enc)  # raises, and is asked again, for a bad one
            self._valid.add(enc)

    def decode(self, enc: Encoded, device: torch.device | str = "cpu") -> torch.Tensor:
        value = self._decoded.get(enc)
        if value is None or value.device != torch.device(device):
            value = super().decode(enc, device)
            self._decoded[enc] = value
        return value.clone()  # the receiver adds its replica into it


def sharing_decodes(codec: Codec) -> Codec:
    """A codec like ``codec`` (same class and settings: name, block size, a sparse codec's
    share, auto's first codec) that decodes each payload object once."""
    cls = type(f"Shared{type(codec).__name__}", (_SharedDecodes, type(codec)), {})
    shared = cast(_SharedDecodes, object.__new__(cls))
    shared.__dict__.update(codec.__dict__)
    # Entries go with their payloads: memory stays what the live deltas hold anyway.
    shared._decoded = weakref.WeakKeyDictionary()
    shared._valid = weakref.WeakSet()
    return shared
