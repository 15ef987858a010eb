"""What a message takes on the wire, counted without building it (or without its payload).

A node counts what it sends and receives by these (``Counters``, the upload cap, the byte
budget), and the simulator charges its links by the same functions, so both runtimes count one
message alike. The sizes are protobuf's: a test checks each against the serialized message.
"""

from __future__ import annotations

import dataclasses

from gossip.messages import Delta, ModelChunk, SnapshotHeader
from gossip.swim import SwimMessage
from node.transport.base import CHUNK_VALUES, SnapshotChunk
from node.transport.wire import (
    delta_to_pb,
    model_chunk_to_pb,
    snapshot_chunk_to_pb,
    swim_to_pb,
)

__all__ = [
    "delta_fp32_nbytes",
    "delta_nbytes",
    "model_nbytes",
    "same_model_nbytes",
    "snapshot_nbytes",
    "swim_nbytes",
]


def _varint_len(n: int) -> int:
    """Bytes protobuf's varint encoding of ``n`` takes."""
    return max(1, (n.bit_length() + 6) // 7)


def _bytes_field_len(n: int) -> int:
    """Bytes a non-empty ``bytes`` field of length n takes (one-byte tag, length, data)."""
    return 1 + _varint_len(n) + n if n else 0


def delta_nbytes(d: Delta) -> int:
    """Serialized size of the delta message (what the node counts as sent), without copying."""
    p = d.payload
    shell = delta_to_pb(
        dataclasses.replace(d, payload=dataclasses.replace(p, scales=b"", data=b""))
    )
    shell_payload = shell.payload.ByteSize()
    payload = shell_payload + _bytes_field_len(len(p.scales)) + _bytes_field_len(len(p.data))
    # Swap the empty payload's field (tag, length, body) for the full one's.
    return (
        shell.ByteSize()
        - _varint_len(shell_payload)
        - shell_payload
        + _varint_len(payload)
        + payload
    )


def delta_fp32_nbytes(d: Delta) -> int:
    """What the same message would take with an fp32 payload and no scales."""
    return delta_nbytes(d) - d.payload.nbytes + 4 * d.payload.numel


def snapshot_nbytes(header: SnapshotHeader, chunk_values: int = CHUNK_VALUES) -> int:
    """Serialized size of all the chunks of a snapshot, without building them."""
    if header.digest:  # named by its digest: one chunk of no values
        return snapshot_chunk_to_pb(header, SnapshotChunk(0, b"")).ByteSize()
    total = 0
    for offset in range(0, header.numel, chunk_values):
        n = 4 * min(chunk_values, header.numel - offset)
        empty = snapshot_chunk_to_pb(header, SnapshotChunk(offset, b""))
        total += empty.ByteSize() + 1 + _varint_len(n) + n  # tag, length, bytes of `data`
    return total


def model_nbytes(numel: int, step: int, chunk_values: int = CHUNK_VALUES) -> int:
    """Serialized size of all the chunks of a model sent to a joiner, without building them."""
    total = 0
    for offset in range(0, numel, chunk_values):
        n = 4 * min(chunk_values, numel - offset)
        empty = model_chunk_to_pb(ModelChunk(numel, offset, b"", step))
        total += empty.ByteSize() + 1 + _varint_len(n) + n  # tag, length, bytes of `data`
    return total


def same_model_nbytes(numel: int, step: int) -> int:
    """Serialized size of the one chunk that tells a joiner it holds the model already."""
    return model_chunk_to_pb(ModelChunk(numel, 0, b"", step, same=True)).ByteSize()


def swim_nbytes(m: SwimMessage, protocol_version: int) -> int:
    """Serialized size of a membership message."""
    return swim_to_pb(m, protocol_version).ByteSize()
