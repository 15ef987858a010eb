"""SWIM's vocabulary: member statuses and their order, message kinds, messages.

Re-exported by :mod:`gossip.swim`, where the member record and the protocol live.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gossip.swim import MemberRecord

__all__ = [
    "ACCUSATIONS",
    "FULL_STATE",
    "LIVE",
    "Kind",
    "Outgoing",
    "Status",
    "SwimMessage",
    "supersedes",
]

NodeId = str


class Status(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


# A departure is the member's own word, so it outranks another's verdict of death.
_RANK = {Status.ALIVE: 0, Status.SUSPECT: 1, Status.DEAD: 2, Status.LEFT: 3}
#: Members that count: the ones a node gossips with.
LIVE = frozenset({Status.ALIVE, Status.SUSPECT})
ACCUSATIONS = frozenset({Status.SUSPECT, Status.DEAD})


def supersedes(new: MemberRecord, old: MemberRecord) -> bool:
    """SWIM's order on updates about one member: a higher incarnation wins; at the same
    incarnation, suspect beats alive, dead beats both, and left beats dead."""
    if new.incarnation != old.incarnation:
        return new.incarnation > old.incarnation
    return _RANK[new.status] > _RANK[old.status]


class Kind(StrEnum):
    PING = "ping"
    ACK = "ack"
    PING_REQ = "ping_req"
    #: A ping-req helper's "the target did not answer me either" (Lifeguard §4.1).
    NACK = "nack"
    #: A member's whole state, answered with the receiver's (memberlist's push-pull).
    PUSH_PULL = "push_pull"
    PUSH_PULL_REPLY = "push_pull_reply"


FULL_STATE = frozenset({Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY})


@dataclass(frozen=True)
class SwimMessage:
    """One protocol message. ``target`` is whom a ping-req asks about, or whose ack is relayed."""

    kind: Kind
    sender: NodeId
    sender_address: str
    seq: int
    target: NodeId = ""
    updates: tuple[MemberRecord, ...] = ()
    #: Carried for the node (a signed revocation list); the protocol ignores it.
    revocations: bytes = b""


@dataclass(frozen=True)
class Outgoing:
    address: str
    message: SwimMessage
