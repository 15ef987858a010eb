"""SWIM's vocabulary: member statuses and their order, member records, message kinds, messages.

Re-exported by :mod:`gossip.swim`, where the protocol lives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ACCUSATIONS",
    "FULL_STATE",
    "LIVE",
    "REGION_NAME",
    "Kind",
    "MemberRecord",
    "Outgoing",
    "Status",
    "SwimMessage",
    "check_region",
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


@dataclass(frozen=True)
class MemberRecord:
    """What one member is believed to be.

    ``public_key`` and ``signature`` let anyone check the parts only the member itself may say
    (:meth:`claim`): its address, its incarnation, and that it left. Suspicion and death are
    other members' claims, so a record that says them keeps the member's signature of "alive"
    and adds the accuser's: ``accuser`` and ``accuser_signature`` over :meth:`accusation`.
    ``certificate`` (DER) is the swarm CA's proof that the id is a member's at all.
    """

    node_id: NodeId
    address: str
    incarnation: int
    status: Status = Status.ALIVE
    public_key: bytes = b""
    signature: bytes = b""
    certificate: bytes = b""
    # swim: who accuses this member (suspect or dead), and its signature of that.
    accuser: NodeId = ""
    accuser_signature: bytes = b""
    #: Empty when others dial ``address`` directly; otherwise the addresses of members that
    #: hold a dial-out session from this member (it cannot be dialled) and forward for it.
    #: Its own claim, so signed with the address.
    relays: tuple[str, ...] = ()
    #: The member is paused (its device's policy or its owner said so): still a member, which
    #: answers probes, but out of everyone's topology until it resumes. Its own claim.
    paused: bool = False
    #: The member's region (``--region``): the regional topology keeps most edges inside one
    #: and a few across. Empty: none named. Its own claim, so signed with the address.
    region: str = ""

    @property
    def reachable(self) -> bool:
        """Whether others dial the member at its address (no relays named)."""
        return not self.relays

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def claim(self) -> bytes:
        """The bytes the member signs."""
        what = "left" if self.status is Status.LEFT else "alive"
        claim = f"murmur-member|{self.node_id}|{self.address}|{self.incarnation}|{what}"
        if self.relays:  # a reachable member signs what it always signed
            claim += "|via=" + ",".join(self.relays)
        if self.paused:  # a member that never pauses signs what it always signed
            claim += "|paused"
        if self.region:  # a member without a region signs what it always signed
            claim += "|region=" + self.region
        return claim.encode()

    def accusation(self) -> bytes:
        """The bytes the accuser signs: that this member, at this incarnation, failed its probe.

        Suspect and dead are one accusation (the status a relay passes on is its own verdict,
        and a receiver takes either as a suspicion), so the status is not signed.
        """
        return f"murmur-accuse|{self.node_id}|{self.incarnation}|{self.accuser}".encode()


#: What a region may be called: it travels in signed member records and metric labels.
REGION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_region(name: str) -> str:
    """``name`` if it is a valid region name (or empty: none), else ValueError."""
    if name and not REGION_NAME.fullmatch(name):
        raise ValueError(
            f"region {name!r}: expected up to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


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
