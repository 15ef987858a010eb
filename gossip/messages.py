"""The messages nodes exchange, as frozen dataclasses (node/transport/wire.py maps them to
protobuf)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gossip.encoded import Encoded
from gossip.swim import MemberRecord

if TYPE_CHECKING:
    from gossip.codecs import Codec

__all__ = [
    "PROTOCOL_VERSION",
    "Delta",
    "Hello",
    "Member",
    "ModelChunk",
    "ParamSpec",
    "SnapshotHeader",
    "TaskFingerprint",
]

#: Bumped on any incompatible change of the wire schema or of its meaning. 3: a snapshot may
#: name its model by digest (``SnapshotHeader.digest``), which a node of 2 would take for a
#: snapshot cut short.
PROTOCOL_VERSION = 3

#: Bytes of a model's digest (SHA-256, gossip/digest.py).
DIGEST_BYTES = 32

NodeId = str


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class TaskFingerprint:
    """What all nodes of a swarm must share: the model's parameters and the gossip codec.

    ``fraction`` is the share of each block a sparse codec sends (it fixes the payload's
    length); 0.0 for the dense codecs, which have none.
    """

    params: tuple[ParamSpec, ...]
    codec: str
    block_size: int
    fraction: float = 0.0

    @classmethod
    def of(cls, params: tuple[ParamSpec, ...], codec: Codec) -> TaskFingerprint:
        """The fingerprint of a task gossiped with ``codec`` (its name and settings)."""
        return cls(params, codec.name, codec.block_size, codec.fraction)

    @property
    def numel(self) -> int:
        """Length of the flat parameter vector that gossip moves."""
        return sum(p.numel for p in self.params)

    def digest(self) -> str:
        parts: list[object] = [
            [[p.name, list(p.shape), p.dtype] for p in self.params],
            self.codec,
            self.block_size,
        ]
        if self.fraction:  # only then: dense codecs keep the digests their checkpoints hold
            parts.append(self.fraction)
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def differences(
        self, other: TaskFingerprint, mine: str = "we have", theirs: str = "they have"
    ) -> list[str]:
        """Human-readable lines saying how ``other`` differs from this one (empty if equal)."""
        out: list[str] = []

        def differ(what: str, a: object, b: object) -> None:
            out.append(f"{what}: {mine} {a}, {theirs} {b}")

        if self.codec != other.codec:
            differ("codec", self.codec, other.codec)
        if self.block_size != other.block_size:
            differ("block size", self.block_size, other.block_size)
        if self.fraction != other.fraction:
            differ("compression fraction", self.fraction, other.fraction)
        ours = {p.name: p for p in self.params}
        others = {p.name: p for p in other.params}
        for name in sorted(ours.keys() | others.keys()):
            a, b = ours.get(name), others.get(name)
            if a is None or b is None:
                differ(f"parameter {name}", "it" if a else "nothing", "it" if b else "nothing")
                continue
            if a.shape != b.shape:
                differ(f"parameter {name} shape", list(a.shape), list(b.shape))
            if a.dtype != b.dtype:
                differ(f"parameter {name} dtype", a.dtype, b.dtype)
        if not out and [p.name for p in self.params] != [p.name for p in other.params]:
            out.append("parameter order differs")
        return out


@dataclass(frozen=True)
class Member:
    node_id: NodeId
    address: str


@dataclass(frozen=True)
class Hello:
    """A joiner's introduction, answered in kind with the member list (departed and dead
    members included, so that the joiner does not bring them back)."""

    protocol_version: int
    self_: MemberRecord
    fingerprint: TaskFingerprint
    members: tuple[MemberRecord, ...] = field(default=())
    revocations: bytes = b""  # opaque to the core: the node checks and applies it
    #: In an answer: the member could not dial the joiner, and took it through the joiner's
    #: dial-out session (the joiner then names relays in its record).
    unreachable: bool = False


@dataclass(frozen=True)
class Delta:
    """q = Q(x_i - x̂_i): the change of sender i's public copy from ``seq - 1`` to ``seq``.

    ``session`` names the log the sequence numbers belong to: a node draws a new one each time it
    starts, so that after a restart its neighbours resync rather than mistake seq 1 for a replay.
    """

    sender: NodeId
    session: int
    seq: int
    step: int
    payload: Encoded
    degree: int = 0
    protocol_version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class SnapshotHeader:
    """Announces the sender's public copy x̂_i at ``seq``; the values follow in chunks.

    ``degree`` (also on every delta) is the sender's number of neighbours: each end of an edge
    weighs it by 1 / (1 + max(d_i, d_j)) with the degrees both have told each other, so the
    weights agree even while the two ends' member views differ.
    """

    sender: NodeId
    session: int
    seq: int
    numel: int
    degree: int = 0
    protocol_version: int = PROTOCOL_VERSION
    #: Set: x̂_i is the model of this digest (gossip/digest.py), and no values follow.
    digest: bytes = b""


@dataclass(frozen=True)
class ModelChunk:
    """Part of a model sent to a joiner: float32 values from ``offset``, of ``numel`` in all."""

    numel: int
    offset: int
    data: bytes  # little-endian float32
    step: int = 0
    #: The sender's model is the one the puller named (its only chunk, with no data).
    same: bool = False
