"""What names a model's exact values: the SHA-256 of its float32 values, little-endian, in order.

Every node of a swarm starts from one model (the task built under the swarm's seed, or the
model a joiner pulled), so at start-up a node often holds, bit for bit, the model another is
about to send it: a joiner's pull (node/daemon/joiner.py) and the first snapshot of each link
(gossip/link.py) then name the model by its digest instead of carrying it (protos/murmur.proto:
``PullModelRequest.have``, ``ModelChunk.same``, ``SnapshotChunk.digest``). The receiver takes
a named model only from its own memory, so a digest never brings values the receiver did not
already hold, and a sender that names a model it does not have gains nothing it could not send.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from gossip.messages import DIGEST_BYTES

__all__ = ["DIGEST_BYTES", "find_model", "model_digest"]


def model_digest(values: torch.Tensor) -> bytes:
    """The digest of a flat vector's values as float32 (a copy to the CPU for a device's)."""
    flat = values.detach().reshape(-1).to("cpu", torch.float32).contiguous()
    if not flat.numel():
        return hashlib.sha256().digest()
    # The bytes as the tensor holds them: little-endian on every platform torch supports.
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).digest()


def find_model(digest: bytes, held: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """The first of the models ``held`` whose digest is ``digest`` (None: none is)."""
    return next((v for v in held if model_digest(v) == digest), None)
