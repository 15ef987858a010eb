"""A whole model received in chunks, into one buffer, with progress."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import torch

from gossip.codecs import all_finite, tensor_from_bytes
from gossip.messages import ModelChunk
from node.telemetry.progress import TransferProgress
from node.transport.base import Reason, Rejected

__all__ = ["receive_model"]

log = logging.getLogger(__name__)


async def receive_model(
    chunks: AsyncIterator[ModelChunk], numel: int, source: str = "", own: torch.Tensor | None = None
) -> tuple[torch.Tensor, int]:
    """Assemble ``numel`` float32 values from ``chunks``; returns them and the sender's step.
    A sender whose model is ``own`` (the puller named it by its digest) says so in one chunk
    instead: then a copy of ``own`` comes back.

    Memory stays at one model-sized buffer plus the chunk in hand: each chunk is copied into
    the buffer and dropped. A pull that lasts says how far it is, its rate and the time left
    (:class:`node.telemetry.progress.TransferProgress`).

    Raises:
        Rejected: a chunk does not fit (wrong size or place), the model ends early, or it
            holds non-finite values; the caller's own model is untouched, since nothing but
            the buffer was written.
        Unreachable: the transfer broke off.
    """
    buffer = torch.empty(numel, dtype=torch.float32)
    filled, step = 0, 0
    progress = TransferProgress(f"pulling the model from {source}", 4 * numel, log)
    same = False
    async for chunk in chunks:
        if chunk.same or same:
            if own is None or same or filled or chunk.numel != numel or own.numel() != numel:
                raise Rejected(
                    Reason.MALFORMED, "the sender says its model is ours, unasked or not alone"
                )
            same, step = True, chunk.step
            continue
        n, rest = divmod(len(chunk.data), 4)
        if chunk.numel != numel or chunk.offset != filled or rest or filled + n > numel:
            raise Rejected(
                Reason.MALFORMED,
                f"a model chunk of {len(chunk.data)} bytes at {chunk.offset} of {chunk.numel} "
                f"does not follow the {filled} values received of our {numel}",
            )
        part = tensor_from_bytes(chunk.data, torch.float32)
        # Checked chunk by chunk: a check of the whole buffer would allocate a model's worth.
        if not all_finite(part):
            raise Rejected(Reason.NON_FINITE, f"the model holds non-finite values at {filled}")
        buffer[filled : filled + n] = part
        filled, step = filled + n, chunk.step
        progress.update(4 * filled)
    if same and own is not None:
        return own.detach().to("cpu", torch.float32, copy=True), step
    if filled != numel:
        raise Rejected(Reason.MALFORMED, f"the model ended after {filled} of {numel} values")
    return buffer, step
