"""How nodes reach each other: one small interface, a gRPC and an in-memory implementation."""

from node.transport.base import (
    DeltaStream,
    Handler,
    Reason,
    Rejected,
    SnapshotChunk,
    Transport,
    Unreachable,
    iter_chunks,
)

__all__ = [
    "DeltaStream",
    "Handler",
    "Reason",
    "Rejected",
    "SnapshotChunk",
    "Transport",
    "Unreachable",
    "iter_chunks",
]
