"""SWIM membership: who is in the swarm, without a coordinator.

A pure state machine after Das, Gupta and Motivala, "SWIM: Scalable Weakly-consistent
Infection-style Process Group Membership Protocol" (DSN 2002), with the suspicion mechanism of
its §4.2 and a suspicion timeout that grows with log n as in Lifeguard (Dadgar et al. 2018):

* every ``period_s`` a member pings the next member of a shuffled round-robin list (§4.3);
* without an ack within ``ping_timeout * period_s`` it asks ``indirect_probes`` others to ping
  the target for it (ping-req);
* without any ack by the end of the period, the target becomes *suspect*; a suspect that does not
  refute within the suspicion timeout is declared *dead*;
* a member refutes a suspicion of itself by raising its incarnation number;
* membership updates ride on every message (piggybacking), each sent about
  ``retransmit_mult * log10(n + 1)`` times.

The machine does no I/O: :meth:`Swim.tick` and :meth:`Swim.receive` return the messages to send,
and time comes from an injected clock. A node that leaves says so (``left``), which spreads like
death but is never suspected first.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gossip.clock import Clock

__all__ = [
    "Kind",
    "MemberRecord",
    "Outgoing",
    "Status",
    "Swim",
    "SwimConfig",
    "SwimMessage",
    "supersedes",
]

NodeId = str


class Status(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


_RANK = {Status.ALIVE: 0, Status.SUSPECT: 1, Status.DEAD: 2, Status.LEFT: 2}
#: Members that count: the ones a node gossips with.
LIVE = frozenset({Status.ALIVE, Status.SUSPECT})


@dataclass(frozen=True)
class MemberRecord:
    """What one member is believed to be.

    ``public_key`` and ``signature`` let anyone check the parts only the member itself may say
    (:meth:`claim`): its address, its incarnation, and that it left. Suspicion and death are
    other members' claims, so a record that says them keeps the member's signature of "alive".
    ``certificate`` (DER) is the swarm CA's proof that the id is a member's at all.
    """

    node_id: NodeId
    address: str
    incarnation: int
    status: Status = Status.ALIVE
    public_key: bytes = b""
    signature: bytes = b""
    certificate: bytes = b""

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def claim(self) -> bytes:
        """The bytes the member signs."""
        what = "left" if self.status is Status.LEFT else "alive"
        return f"murmur-member|{self.node_id}|{self.address}|{self.incarnation}|{what}".encode()


def supersedes(new: MemberRecord, old: MemberRecord) -> bool:
    """SWIM's order on updates about one member: a higher incarnation wins; at the same
    incarnation, suspect beats alive and dead (or left) beats both."""
    if new.incarnation != old.incarnation:
        return new.incarnation > old.incarnation
    return _RANK[new.status] > _RANK[old.status]


class Kind(StrEnum):
    PING = "ping"
    ACK = "ack"
    PING_REQ = "ping_req"


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


@dataclass(frozen=True)
class SwimConfig:
    """Args:
    period_s: one probe per member per period.
    ping_timeout: the fraction of a period to wait for a direct ack before asking others.
    indirect_probes: how many others to ask (k).
    suspicion_mult: a suspect is dead after ``suspicion_mult * max(1, log10 n)`` periods.
    retransmit_mult: each update is piggybacked ``ceil(retransmit_mult * log10(n + 1))`` times.
    max_piggyback: updates per message, besides the sender's own record.
    forget_after_s: how long dead and departed members are remembered (so that stale gossip
        about them cannot bring them back).
    """

    period_s: float = 1.0
    ping_timeout: float = 0.4
    indirect_probes: int = 3
    suspicion_mult: float = 5.0
    retransmit_mult: float = 6.0
    max_piggyback: int = 8
    forget_after_s: float = 120.0

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError("period_s must be positive")
        if not 0 < self.ping_timeout < 1:
            raise ValueError("ping_timeout is a fraction of the period, between 0 and 1")
        if self.indirect_probes < 0 or self.suspicion_mult <= 0 or self.retransmit_mult <= 0:
            raise ValueError("indirect_probes, suspicion_mult and retransmit_mult must be positive")

    @property
    def ping_timeout_s(self) -> float:
        return self.ping_timeout * self.period_s

    def suspicion_timeout_s(self, n: int) -> float:
        return self.suspicion_mult * max(1.0, math.log10(max(n, 1))) * self.period_s

    def retransmit_limit(self, n: int) -> int:
        return max(1, math.ceil(self.retransmit_mult * math.log10(n + 1)))

    def detection_deadline_s(self, n: int) -> float:
        """How long after a crash every member of an n-member swarm has it dead, at the latest
        expected: a few periods until someone's probe fails, the suspicion timeout, and the
        periods the news takes to reach everyone (it doubles its reach each period)."""
        spread = math.ceil(math.log2(max(n, 2))) + 2
        return (3 + spread) * self.period_s + self.suspicion_timeout_s(n)


@dataclass
class _Probe:
    target: NodeId
    seq: int
    started: float
    indirect_sent: bool = False


@dataclass
class _Relay:
    """A ping sent on behalf of ``requester``, whose ack goes back to it under ``seq``."""

    requester_address: str
    seq: int
    target: NodeId
    expires: float


@dataclass
class _Entry:
    record: MemberRecord
    changed_at: float
    suspect_since: float | None = None
    checked: bool = False  # probed by us since it became suspect


@dataclass
class Swim:
    """One member's view and its part in the protocol.

    Args:
        node_id, address: this member.
        incarnation: where this member's incarnation starts; a member that restarts must start
            above any incarnation it had before (the node uses its start time in milliseconds).
        rng: drives the probe order and the choice of helpers (seeded in tests).
    """

    node_id: NodeId
    address: str
    incarnation: int
    cfg: SwimConfig
    clock: Clock
    rng: random.Random = field(default_factory=random.Random)
    #: Signs this member's own records (with the key whose hash is its id); None: unsigned.
    sign: Callable[[bytes], bytes] | None = None
    public_key: bytes = b""
    #: The CA's certificate for this member's key (DER), carried on its own records.
    certificate: bytes = b""
    #: Checks a record's signature; records that fail are dropped (None: take all).
    verify: Callable[[MemberRecord], bool] | None = None

    def __post_init__(self) -> None:
        self._members: dict[NodeId, _Entry] = {}
        # Indexes into _members, so that timers cost what the suspects and the departed number,
        # not what the swarm does (a simulator runs a thousand members in one process).
        self._suspects: dict[NodeId, None] = {}
        self._gone: dict[NodeId, None] = {}
        self._dissemination: dict[NodeId, tuple[MemberRecord, int]] = {}
        self._changes: list[MemberRecord] = []
        self._order: list[NodeId] = []
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._seq = 0
        self._next_probe = self.clock.now()
        self.leaving = False
        #: Messages and piggybacked records sent, for traffic figures.
        self.sent_messages = 0
        #: Records dropped because their signature did not hold.
        self.forged = 0
        self._signed: tuple[MemberRecord, MemberRecord] | None = None

    # -- the view -----------------------------------------------------------------------------

    @property
    def me(self) -> MemberRecord:
        status = Status.LEFT if self.leaving else Status.ALIVE
        record = MemberRecord(self.node_id, self.address, self.incarnation, status)
        if self.sign is None:
            return record
        if self._signed is None or self._signed[0] != record:  # signing is slow: once per change
            signed = replace(
                record,
                public_key=self.public_key,
                signature=self.sign(record.claim()),
                certificate=self.certificate,
            )
            self._signed = (record, signed)
        return self._signed[1]

    def record(self, node_id: NodeId) -> MemberRecord | None:
        if node_id == self.node_id:
            return self.me
        entry = self._members.get(node_id)
        return entry.record if entry else None

    def live_members(self) -> list[MemberRecord]:
        """Alive and suspect members, this one included, by id."""
        others = [e.record for e in self._members.values() if e.record.live]
        return sorted([self.me, *others], key=lambda r: r.node_id)

    def records(self) -> list[MemberRecord]:
        """Everything this member knows, dead and departed included (for a joiner)."""
        return sorted(
            [self.me, *(e.record for e in self._members.values())], key=lambda r: r.node_id
        )

    def pending_updates(self) -> list[MemberRecord]:
        """Updates still waiting to be piggybacked (for tests and figures)."""
        return [record for record, _ in self._dissemination.values()]

    def clear_updates(self) -> None:
        """Drop every update still waiting to be piggybacked: for a member that starts in a
        swarm long settled, where everyone knows what they say (a simulator's start)."""
        self._dissemination.clear()

    def drain_changes(self) -> list[MemberRecord]:
        """Records whose status or address changed since the last call (the node reacts)."""
        changes, self._changes = self._changes, []
        return changes

    # -- updates ------------------------------------------------------------------------------

    def merge(self, records: Iterable[MemberRecord]) -> None:
        """Apply membership updates, from piggybacking or from a joiner's hello."""
        for record in records:
            self._apply(record)

    def _apply(self, record: MemberRecord) -> None:
        if self.verify is not None and not self.verify(record):
            self.forged += 1
            return
        if record.node_id == self.node_id:
            self._about_me(record)
            return
        now = self.clock.now()
        entry = self._members.get(record.node_id)
        if entry is not None and not supersedes(record, entry.record):
            if supersedes(entry.record, record) and record.node_id not in self._dissemination:
                # Someone still spreads old news (a suspicion already refuted, say): spread the
                # newer record again, so the old one dies out instead of outliving the answer.
                self._gossip(entry.record)
            return
        if entry is None and not record.live:
            return  # news of the death of a stranger: nothing to forget
        previous = entry.record if entry else None
        self._set_entry(_Entry(record, now, now if record.status is Status.SUSPECT else None))
        self._gossip(record)
        if (
            previous is None
            or previous.status != record.status
            or previous.address != record.address
        ):
            self._changes.append(record)

    def _set_entry(self, entry: _Entry) -> None:
        node_id = entry.record.node_id
        self._members[node_id] = entry
        if entry.suspect_since is None:
            self._suspects.pop(node_id, None)
        else:
            self._suspects[node_id] = None
        if entry.record.live:
            self._gone.pop(node_id, None)
        else:
            self._gone[node_id] = None

    def _about_me(self, record: MemberRecord) -> None:
        if self.leaving:
            return
        if record.status is not Status.ALIVE and record.incarnation >= self.incarnation:
            # Refute (SWIM §4.2): a newer incarnation of "alive" overrides the suspicion. It
            # needs no place in the update queue: every message starts with our own record.
            self.incarnation = record.incarnation + 1

    def _gossip(self, record: MemberRecord) -> None:
        n = len(self._members) + 1
        # Re-inserted at the end: among updates sent equally often, the older goes first.
        self._dissemination.pop(record.node_id, None)
        self._dissemination[record.node_id] = (record, self.cfg.retransmit_limit(n))

    def _piggyback(self, to: NodeId = "") -> tuple[MemberRecord, ...]:
        """Our own record, then the least-sent updates; each use counts against its budget.

        A suspect we write to is told of its suspicion first, so that it can refute at once
        (the "buddy system" of Lifeguard, Dadgar et al. 2018, §4.3).
        """
        chosen = sorted(self._dissemination.items(), key=lambda kv: -kv[1][1])
        out = [self.me]
        entry = self._members.get(to)
        if entry is not None and entry.record.status is Status.SUSPECT:
            out.append(entry.record)
        for node_id, (record, left) in chosen[: self.cfg.max_piggyback]:
            out.append(record)
            if left <= 1:
                del self._dissemination[node_id]
            else:
                self._dissemination[node_id] = (record, left - 1)
        return tuple(out)

    def _message(
        self, kind: Kind, address: str, seq: int, target: NodeId = "", to: NodeId = ""
    ) -> Outgoing:
        self.sent_messages += 1
        msg = SwimMessage(kind, self.node_id, self.address, seq, target, self._piggyback(to))
        return Outgoing(address, msg)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- the protocol -------------------------------------------------------------------------

    def receive(self, msg: SwimMessage) -> list[Outgoing]:
        """Handle one message; returns the messages it causes."""
        self.merge(msg.updates)
        if msg.kind is Kind.PING:
            return [self._message(Kind.ACK, msg.sender_address, msg.seq, self.node_id, msg.sender)]
        if msg.kind is Kind.PING_REQ:
            target = self.record(msg.target)
            if target is None or not target.live or target.node_id == self.node_id:
                return []
            seq = self._next_seq()
            self._relays[seq] = _Relay(
                msg.sender_address, msg.seq, msg.target, self.clock.now() + self.cfg.period_s
            )
            return [self._message(Kind.PING, target.address, seq, to=target.node_id)]
        # An ack: for our own probe, or one we relay for someone else.
        if self._probe is not None and msg.seq == self._probe.seq:
            self._probe = None
            return []
        relay = self._relays.pop(msg.seq, None)
        if relay is not None:
            return [self._message(Kind.ACK, relay.requester_address, relay.seq, relay.target)]
        return []

    def tick(self) -> list[Outgoing]:
        """Advance timers: probes, indirect probes, suspicion timeouts. Returns what to send."""
        now = self.clock.now()
        out: list[Outgoing] = []
        probe = self._probe
        if (
            probe is not None
            and not probe.indirect_sent
            and now >= probe.started + self.cfg.ping_timeout_s
        ):
            probe.indirect_sent = True
            out += self._ping_reqs(probe)
        if probe is not None and now >= probe.started + self.cfg.period_s:
            self._probe = None
            target = self.record(probe.target)
            if target is not None and target.status is Status.ALIVE:
                self._apply(replace(target, status=Status.SUSPECT))
        if self._probe is None and now >= self._next_probe and not self.leaving:
            out += self._start_probe(now)
        self._expire(now)
        return out

    def _start_probe(self, now: float) -> list[Outgoing]:
        self._next_probe = now + self.cfg.period_s
        target = self._next_target()
        if target is None:
            return []
        self._probe = _Probe(target.node_id, self._next_seq(), now)
        return [self._message(Kind.PING, target.address, self._probe.seq, to=target.node_id)]

    def _next_target(self) -> MemberRecord | None:
        """A suspect we have not probed yet, else round robin over a shuffled list, reshuffled
        each pass (SWIM §4.3).

        Probing a suspect ourselves means its answer, which carries its refutation, reaches us
        directly instead of depending on gossip that may die out before it gets here.
        """
        suspects = [
            e
            for e in map(self._members.__getitem__, self._suspects)
            if e.suspect_since is not None and not e.checked
        ]
        if suspects:
            entry = min(suspects, key=lambda e: e.suspect_since or 0.0)
            entry.checked = True
            return entry.record
        for _ in range(2):
            while self._order:
                record = self.record(self._order.pop())
                if record is not None and record.live and record.node_id != self.node_id:
                    return record
            self._order = [e.record.node_id for e in self._members.values() if e.record.live]
            self.rng.shuffle(self._order)
        return None

    def _ping_reqs(self, probe: _Probe) -> list[Outgoing]:
        helpers = [
            e.record
            for e in self._members.values()
            if e.record.status is Status.ALIVE and e.record.node_id != probe.target
        ]
        chosen = self.rng.sample(helpers, min(self.cfg.indirect_probes, len(helpers)))
        return [self._message(Kind.PING_REQ, h.address, probe.seq, probe.target) for h in chosen]

    def _expire(self, now: float) -> None:
        n = len(self._members) + 1
        timeout = self.cfg.suspicion_timeout_s(n)
        for node_id in list(self._suspects):
            entry = self._members[node_id]
            if entry.suspect_since is not None and now >= entry.suspect_since + timeout:
                self._apply(replace(entry.record, status=Status.DEAD))
        for node_id in list(self._gone):
            entry = self._members[node_id]
            if now >= entry.changed_at + self.cfg.forget_after_s:
                del self._members[node_id]
                del self._gone[node_id]
                self._dissemination.pop(node_id, None)
        for seq, relay in list(self._relays.items()):
            if now >= relay.expires:
                del self._relays[seq]

    def next_deadline(self) -> float:
        """The next time :meth:`tick` has something to do."""
        times = [math.inf if self.leaving else self._next_probe]
        if self._probe is not None:
            if not self._probe.indirect_sent:
                times.append(self._probe.started + self.cfg.ping_timeout_s)
            times.append(self._probe.started + self.cfg.period_s)
        n = len(self._members) + 1
        times += [
            e.suspect_since + self.cfg.suspicion_timeout_s(n)
            for e in map(self._members.__getitem__, self._suspects)
            if e.suspect_since is not None
        ]
        return min(times)

    def expel(self, node_id: NodeId) -> None:
        """Declare ``node_id`` dead for good here (it was revoked): its record goes, and with
        a ``verify`` that refuses it, it cannot come back."""
        entry = self._members.get(node_id)
        if entry is not None and entry.record.live:
            record = replace(entry.record, status=Status.DEAD)
            self._set_entry(_Entry(record, self.clock.now()))
            self._changes.append(record)

    def ping(self, address: str) -> Outgoing:
        """A ping outside the probe schedule (to check an address someone gave); its ack is
        ignored, but the call that carries it shows whether, and who, answers there."""
        return self._message(Kind.PING, address, self._next_seq())

    def leave(self, fanout: int, first: Iterable[NodeId] = ()) -> list[Outgoing]:
        """Announce departure to the members in ``first`` and to others, ``fanout`` in all
        (or every live member if fewer); then stop probing."""
        self.leaving = True
        live = {e.record.node_id: e.record for e in self._members.values() if e.record.live}
        chosen = [live[i] for i in first if i in live]
        rest = [r for i, r in live.items() if i not in set(first)]
        chosen += self.rng.sample(rest, max(0, min(fanout - len(chosen), len(rest))))
        self._dissemination.clear()
        return [self._message(Kind.PING, r.address, self._next_seq()) for r in chosen]
