"""SWIM membership: who is in the swarm, without a coordinator.

A pure state machine after Das, Gupta and Motivala, "SWIM: Scalable Weakly-consistent
Infection-style Process Group Membership Protocol" (DSN 2002), with the suspicion mechanism of
its §4.2 and Lifeguard's refinements (Dadgar et al. 2018; see :mod:`gossip.lifeguard`):

* every probe period a member pings the next member of a shuffled round-robin list (§4.3);
* without an ack within the ping timeout it asks ``indirect_probes`` others to ping the target
  for it (ping-req); a helper whose own ping goes unanswered says so (a nack);
* without any ack by the end of the period, the prober *accuses* the target: a suspicion,
  signed by the accuser, that spreads; a suspect that does not refute in time is dead to the
  member that holds the suspicion, after a timeout that shrinks with each other accuser
  (Lifeguard §4.2), and the probe period and timeout stretch while this member itself misses
  acks (Lifeguard §4.1);
* a member refutes a suspicion of itself by raising its incarnation number;
* membership updates ride on every message (piggybacking), each sent about
  ``retransmit_mult * log10(n + 1)`` times.

Two mechanisms heal what gossip misses (memberlist and Serf do the same): dead (not departed)
members are pinged again at a slow rate (a reconnect) until they are forgotten, and every
push-pull period a member swaps its whole state with a random member. So a partition ends in one
view: a reconnect ping tells a member on the other side that it is believed dead, it refutes, and
the answer carries the refutation back.

Accusations name their accuser, and a member counts each accuser once. Hearsay never kills: a
member that hears that another is dead takes it as one more suspicion, which its own timer must
see through, so one insider that re-sends death notices cannot keep a live member out of a view
while the member refutes. A record that is not news (by incarnation, then status) changes
nothing. What a member holds is bounded: the view (``max_members``), the update queue
(``max_pending``), the records taken from one message, and the members new to us that one
relayer may introduce per second; what is over is dropped and counted in :attr:`Swim.refused`.

The machine does no I/O: :meth:`Swim.tick` and :meth:`Swim.receive` return the messages to send,
and time comes from an injected clock. A node that leaves says so (``left``), which spreads like
death but is never suspected first.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gossip.clock import Clock
from gossip.lifeguard import LocalHealth, RelayerRate, suspicion_timeout_s

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
    """

    node_id: NodeId
    address: str
    incarnation: int
    status: Status = Status.ALIVE
    public_key: bytes = b""
    signature: bytes = b""
    # swim: who accuses this member (suspect or dead), and its signature of that.
    accuser: NodeId = ""
    accuser_signature: bytes = b""

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def claim(self) -> bytes:
        """The bytes the member signs."""
        what = "left" if self.status is Status.LEFT else "alive"
        return f"murmur-member|{self.node_id}|{self.address}|{self.incarnation}|{what}".encode()

    def accusation(self) -> bytes:
        """The bytes the accuser signs: that this member, at this incarnation, failed its probe.

        Suspect and dead are one accusation (the status a relay passes on is its own verdict,
        and a receiver takes either as a suspicion), so the status is not signed.
        """
        return f"murmur-accuse|{self.node_id}|{self.incarnation}|{self.accuser}".encode()


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


_FULL_STATE = frozenset({Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY})


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
    period_s: one probe per member per period (at full local health).
    ping_timeout: the fraction of a period to wait for a direct ack before asking others.
    indirect_probes: how many others to ask (k).
    suspicion_mult: a suspect with enough confirmations is dead after
        ``suspicion_mult * max(1, log10 n)`` periods (the minimum suspicion timeout).
    suspicion_max_mult: a suspicion nobody else confirms lasts this many times the minimum.
    confirmations: accusers besides the first that bring a suspicion down to the minimum (K).
    max_health: the local health score's cap; probes stretch up to ``max_health + 1`` times.
    retransmit_mult: each update is piggybacked ``ceil(retransmit_mult * log10(n + 1))`` times.
    max_piggyback: updates per message, besides the sender's own record.
    reconnect_interval_s: how often a member pings one of the members it holds dead (with the
        probability that makes it about one ping per dead member and interval, swarm-wide).
    forget_after_s: how long dead and departed members are remembered (dead ones are pinged
        again all that time), so that old records about them change nothing.
    push_pull_interval_s: how often a member swaps its whole state with a random member, up to
        32 members; above, times ``ceil(log2 n - 5) + 1``.
    max_members: the most members a view holds, dead and departed included; a full view makes
        room by forgetting the member longest dead, else refuses newcomers.
    max_pending: the most updates waiting to be piggybacked; a full queue drops the update
        that has been sent most.
    new_members_per_s, new_members_burst: the rate (a token bucket per relayer) at which one
        relayer may introduce members new to us.
    """

    period_s: float = 1.0  # a crash is noticed within a second or two (SWIM §5)
    ping_timeout: float = 0.4  # far above any round trip, and leaves 0.6 of a period for helpers
    indirect_probes: int = 3  # memberlist's k: a false failure then takes four lost paths
    suspicion_mult: float = 5.0  # 10.5 s at 128 members: time for the suspect to hear and refute
    suspicion_max_mult: float = 6.0  # memberlist's: one accuser alone gives a minute at 128
    confirmations: int = 3  # three others that failed too are strong evidence (Lifeguard §4.2)
    max_health: int = 8  # memberlist's awareness cap: a sick member probes 9x slower at worst
    retransmit_mult: float = 6.0  # 13 sends at 128 members: reaches all with high probability
    max_piggyback: int = 8  # ~2 KB of records (key and signature each) on one message
    reconnect_interval_s: float = 5.0  # a healed 3|3 split is one view in ~5 s, well within 30 s
    forget_after_s: float = 86_400.0  # Serf reconnects failed members for 24 h
    push_pull_interval_s: float = 15.0  # repairs within ~2 periods (30 s); 0.5 KB/s at 32 members
    max_members: int = 4096  # 16x the largest simulated swarm; ~2 MB of records at most
    max_pending: int = 256  # at ~40 records/s sent, more could not go out in their budget anyway
    new_members_per_s: float = 2.0  # joins come a few a minute; one relayer cannot swamp a view
    new_members_burst: int = 64  # a whole small swarm at once, as a push-pull from a new member

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError("period_s must be positive")
        if not 0 < self.ping_timeout < 1:
            raise ValueError("ping_timeout is a fraction of the period, between 0 and 1")
        if self.indirect_probes < 0 or self.suspicion_mult <= 0 or self.retransmit_mult <= 0:
            raise ValueError("indirect_probes, suspicion_mult and retransmit_mult must be positive")
        if self.suspicion_max_mult < 1 or self.confirmations < 0 or self.max_health < 0:
            raise ValueError("suspicion_max_mult >= 1, confirmations >= 0, max_health >= 0")
        if min(self.reconnect_interval_s, self.forget_after_s, self.push_pull_interval_s) <= 0:
            raise ValueError("reconnect, forget and push-pull intervals must be positive")
        if min(self.max_members, self.max_pending, self.max_piggyback, self.new_members_burst) < 1:
            raise ValueError("max_members, max_pending, max_piggyback and the burst must be >= 1")
        if self.new_members_per_s <= 0:
            raise ValueError("new_members_per_s must be positive")

    @property
    def ping_timeout_s(self) -> float:
        return self.ping_timeout * self.period_s

    def suspicion_timeout_s(self, n: int) -> float:
        """The minimum suspicion timeout in an n-member swarm."""
        return self.suspicion_mult * max(1.0, math.log10(max(n, 1))) * self.period_s

    def expected_confirmations(self, n: int) -> int:
        """K, or 0 where too few members could confirm (as memberlist)."""
        return self.confirmations if n - 2 >= self.confirmations else 0

    def retransmit_limit(self, n: int) -> int:
        return max(1, math.ceil(self.retransmit_mult * math.log10(n + 1)))

    def push_pull_period_s(self, n: int) -> float:
        if n <= 32:
            return self.push_pull_interval_s
        return (math.ceil(math.log2(n) - 5) + 1) * self.push_pull_interval_s

    def detection_deadline_s(self, n: int) -> float:
        """How long after a crash every member of an n-member swarm has it dead, at the latest
        expected: a few periods until someone's probe fails, the periods the suspicion takes to
        reach everyone (it doubles its reach each period), and the minimum suspicion timeout
        (a real crash is confirmed by everyone who probes it)."""
        spread = math.ceil(math.log2(max(n, 2))) + 2
        return (3 + spread) * self.period_s + self.suspicion_timeout_s(n)


@dataclass
class _Probe:
    target: NodeId
    incarnation: int
    seq: int
    started: float
    timeout_s: float
    period_s: float
    indirect_sent: bool = False
    helpers: int = 0
    nacks: int = 0


@dataclass
class _Relay:
    """A ping sent on behalf of ``requester``, whose ack goes back to it under ``seq``."""

    requester_address: str
    seq: int
    target: NodeId
    nack_at: float
    expires: float
    nacked: bool = False


@dataclass
class _Entry:
    """One member as this member judges it. ``record.status`` is this member's verdict, and
    ``record`` is always one that others can check: the member's own, or an accusation of it."""

    record: MemberRecord
    changed_at: float
    suspect_since: float | None = None
    accusers: set[NodeId] = field(default_factory=set)  # distinct, at this incarnation
    probed_at: float = -math.inf  # our last probe of it since it became suspect
    failed_at: float = -math.inf  # when our last probe of it failed
    expelled: bool = False  # revoked: never pinged again


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
    #: Signs this member's own records and accusations (with the key whose hash is its id).
    sign: Callable[[bytes], bytes] | None = None
    public_key: bytes = b""
    #: Admits a record (its member's signature, and whatever else the node requires); every
    #: record passes through it, and those that fail are dropped (None: take all).
    verify: Callable[[MemberRecord], bool] | None = None
    #: Checks an accuser's signature: (its public key, the signed bytes, the signature). When
    #: set, an accusation must name a member we know and carry its signature; None: accusations
    #: are taken as they come (tests, the simulator).
    check_signature: Callable[[bytes, bytes, bytes], bool] | None = None

    def __post_init__(self) -> None:
        cfg = self.cfg
        self._members: dict[NodeId, _Entry] = {}
        # Indexes into _members, so that timers cost what the suspects and the departed number,
        # not what the swarm does (a simulator runs a thousand members in one process). _gone
        # is in the order members left the view, oldest first.
        self._suspects: dict[NodeId, None] = {}
        self._gone: dict[NodeId, None] = {}
        self._dissemination: dict[NodeId, tuple[MemberRecord, int]] = {}
        self._changes: list[MemberRecord] = []
        self._order: list[NodeId] = []
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._seq = 0
        now = self.clock.now()
        self._next_probe = now
        # Staggered, so that members started together do not reconnect and swap in step.
        self._next_reconnect = now + cfg.reconnect_interval_s * self.rng.random()
        self._next_push_pull = now + cfg.push_pull_interval_s * self.rng.random()
        self._refuted_at = -math.inf
        self._checked_last = False
        self._revived: list[str] = []
        self._revival_push_pull_at = -math.inf
        self.health = LocalHealth(cfg.max_health)
        self._new_members = RelayerRate(
            cfg.new_members_per_s, cfg.new_members_burst, cfg.max_members
        )
        self.leaving = False
        #: Messages and piggybacked records sent, for traffic figures.
        self.sent_messages = 0
        #: Records dropped because their signature did not hold.
        self.forged = 0
        #: Records dropped for other reasons, by reason.
        self.refused: Counter[str] = Counter()
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
                record, public_key=self.public_key, signature=self.sign(record.claim())
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
        """Everything this member knows and may pass on, dead and departed included (for a
        joiner, and a push-pull), by id; revoked members are left out."""
        known = [e.record for e in self._members.values() if not e.expelled]
        return sorted([self.me, *known], key=lambda r: r.node_id)

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

    def merge(self, records: Iterable[MemberRecord], relayer: NodeId | None = None) -> None:
        """Apply membership updates, from piggybacking or from a hello.

        Args:
            relayer: who passed them on; the members new to us that it may introduce are
                rate-limited. None: records this member asked for (the answer to its own hello).
        """
        # Members' own records first, so that an accusation in the same batch (a joiner's
        # first list) finds its accuser known.
        for record in sorted(records, key=lambda r: r.status in ACCUSATIONS):
            self._apply(record, relayer)

    def _apply(self, record: MemberRecord, relayer: NodeId | None, own: bool = False) -> None:
        if record.node_id == self.node_id:
            self._about_me(record)
            return
        entry = self._members.get(record.node_id)
        if entry is None:
            if record.live and self._room_for_newcomer(relayer) and self._admit(record, own):
                suspect = record.status is Status.SUSPECT
                self._set(_Entry(record, self.clock.now()), record, suspect)
            # else news of the end of a stranger: nothing to forget
            return
        if not self._news(entry, record):
            if (
                supersedes(entry.record, record)
                and record.node_id not in self._dissemination
                and self._admit(record, own)
            ):
                # Someone still spreads old news (a suspicion already refuted, say): spread the
                # newer record again, so the old one dies out instead of outliving the answer.
                self._gossip(entry.record)
            return
        if not self._admit(record, own):
            return
        if record.status not in ACCUSATIONS:
            self._set(entry, record, suspect=False)
        elif record.incarnation > entry.record.incarnation or entry.record.status is Status.ALIVE:
            # Hearsay of death is a suspicion here: our own timer must see it through.
            self._set(entry, replace(record, status=Status.SUSPECT), suspect=True)
        else:  # one more accuser of a suspect
            entry.accusers.add(record.accuser)
            self._gossip(replace(record, status=Status.SUSPECT))

    def _news(self, entry: _Entry, record: MemberRecord) -> bool:
        """Whether ``record`` could change what we hold (checked before any signature)."""
        old = entry.record
        if record.incarnation != old.incarnation:
            return record.incarnation > old.incarnation
        if record.status in ACCUSATIONS:
            if old.status is Status.ALIVE:
                return True
            return old.status is Status.SUSPECT and record.accuser not in entry.accusers
        return _RANK[record.status] > _RANK[old.status]

    def _set(self, entry: _Entry, record: MemberRecord, suspect: bool) -> None:
        """Hold ``record`` as our verdict on its member, spread it, and note a change."""
        previous = entry.record if entry.record is not record else None
        now = self.clock.now()
        new = _Entry(record, now, now if suspect else None, expelled=entry.expelled)
        if suspect:
            new.accusers.add(record.accuser)
        self._set_entry(new)
        self._gossip(record)
        if record.live and (previous is None or not previous.live):
            # Probed in this pass, not after the next reshuffle (SWIM §4.3 inserts a newcomer
            # at a random place in the list).
            self._order.insert(self.rng.randint(0, len(self._order)), record.node_id)
            if previous is not None and previous.status is Status.DEAD:
                # Back from the dead, likely from across a partition that healed: swap states
                # with it now, so that each side learns the other's news in bulk.
                self._revived.append(record.address)
        if (
            previous is None
            or previous.status != record.status
            or previous.address != record.address
        ):
            self._changes.append(record)

    def _room_for_newcomer(self, relayer: NodeId | None) -> bool:
        if relayer is not None and not self._new_members.take(relayer, self.clock.now()):
            self.refused["new members over the relayer's rate"] += 1
            return False
        if len(self._members) >= self.cfg.max_members:
            if not self._gone:
                self.refused["view full"] += 1
                return False
            self._forget(next(iter(self._gone)))  # the member longest dead or departed
        return True

    def _admit(self, record: MemberRecord, own: bool = False) -> bool:
        """The hooks' verdict on a record; ``own``: an accusation this member just made."""
        if own:
            return True
        if self.verify is not None and not self.verify(record):
            self.forged += 1
            return False
        if record.status not in ACCUSATIONS or self.check_signature is None:
            return True
        if record.accuser in ("", record.node_id):
            self.forged += 1  # an accusation names its accuser, and nobody accuses itself
            return False
        accuser = self.record(record.accuser)
        if accuser is None:
            self.refused["accuser unknown"] += 1
            return False
        if (
            accuser.node_id != self.node_id
            and self.verify is not None
            and not self.verify(accuser)  # a revoked accuser counts for nothing
        ) or not self.check_signature(
            accuser.public_key, record.accusation(), record.accuser_signature
        ):
            self.forged += 1
            return False
        return True

    def _set_entry(self, entry: _Entry) -> None:
        node_id = entry.record.node_id
        self._members[node_id] = entry
        if entry.suspect_since is None:
            self._suspects.pop(node_id, None)
        else:
            self._suspects[node_id] = None
        if entry.record.live:
            self._gone.pop(node_id, None)
        elif node_id not in self._gone:
            self._gone[node_id] = None

    def _forget(self, node_id: NodeId) -> None:
        del self._members[node_id]
        self._gone.pop(node_id, None)
        self._suspects.pop(node_id, None)
        self._dissemination.pop(node_id, None)

    def _about_me(self, record: MemberRecord) -> None:
        if self.leaving or record.status is Status.ALIVE:
            return
        if record.incarnation > self.incarnation:
            # Only this member raises its incarnation: nobody knows one above it.
            self.refused["about us, from our future"] += 1
            return
        if record.incarnation < self.incarnation or not self._admit(record):
            return
        # Refute (SWIM §4.2): a newer incarnation of "alive" overrides the suspicion. It
        # needs no place in the update queue: every message starts with our own record.
        self.incarnation += 1
        now = self.clock.now()
        if now >= self._refuted_at + self.cfg.period_s:
            # Being suspected hints that we are slow (Lifeguard §4.1); counted once a period,
            # so that one accuser cannot push our probes to their slowest.
            self.health.apply(1)
            self._refuted_at = now

    def _accuse(self, entry: _Entry) -> None:
        """Our own probe of the member failed: accuse it, signed, and count ourselves."""
        if self.node_id in entry.accusers:
            return
        accusation = replace(
            entry.record, status=Status.SUSPECT, accuser=self.node_id, accuser_signature=b""
        )
        if self.sign is not None:
            accusation = replace(accusation, accuser_signature=self.sign(accusation.accusation()))
        self._apply(accusation, None, own=True)

    def _gossip(self, record: MemberRecord) -> None:
        n = len(self._members) + 1
        # Re-inserted at the end: among updates sent equally often, the older goes first.
        self._dissemination.pop(record.node_id, None)
        if len(self._dissemination) >= self.cfg.max_pending:
            most_sent = min(self._dissemination, key=lambda i: self._dissemination[i][1])
            del self._dissemination[most_sent]
            self.refused["update queue full"] += 1
        self._dissemination[record.node_id] = (record, self.cfg.retransmit_limit(n))

    def _piggyback(self, to: NodeId = "") -> tuple[MemberRecord, ...]:
        """Our own record, then the least-sent updates; each use counts against its budget.

        A member we write to that we hold suspect or dead is told so first, so that it can
        refute at once (the "buddy system" of Lifeguard, Dadgar et al. 2018, §4.3; for the
        dead, that is how a partition heals).
        """
        chosen = heapq.nlargest(
            self.cfg.max_piggyback, self._dissemination.items(), key=lambda kv: kv[1][1]
        )
        out = [self.me]
        entry = self._members.get(to)
        told = entry is not None and entry.record.status in ACCUSATIONS
        if entry is not None and told:
            out.append(entry.record)
        for node_id, (record, left) in chosen:
            if not (told and node_id == to):
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
        if kind in _FULL_STATE:
            updates = tuple(self.records()[: self.cfg.max_members])
        else:
            updates = self._piggyback(to)
        return Outgoing(
            address, SwimMessage(kind, self.node_id, self.address, seq, target, updates)
        )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- the protocol -------------------------------------------------------------------------

    def receive(self, msg: SwimMessage) -> list[Outgoing]:
        """Handle one message; returns the messages it causes."""
        limit = self.cfg.max_members if msg.kind in _FULL_STATE else self.cfg.max_piggyback + 2
        if len(msg.updates) > limit:
            self.refused["records over a message's limit"] += len(msg.updates) - limit
        self.merge(msg.updates[:limit], relayer=msg.sender)
        if msg.kind is Kind.PING:
            return [self._message(Kind.ACK, msg.sender_address, msg.seq, self.node_id, msg.sender)]
        if msg.kind is Kind.PING_REQ:
            target = self.record(msg.target)
            if target is None or not target.live or target.node_id == self.node_id:
                return []
            seq = self._next_seq()
            now = self.clock.now()
            self._relays[seq] = _Relay(
                msg.sender_address,
                msg.seq,
                msg.target,
                now + self.cfg.ping_timeout_s,
                now + self.cfg.period_s,
            )
            return [self._message(Kind.PING, target.address, seq, to=target.node_id)]
        if msg.kind is Kind.PUSH_PULL:
            return [self._message(Kind.PUSH_PULL_REPLY, msg.sender_address, msg.seq)]
        probe = self._probe
        if msg.kind is Kind.NACK:
            if probe is not None and msg.seq == probe.seq and msg.target == probe.target:
                probe.nacks += 1
            return []
        if msg.kind is not Kind.ACK:
            return []
        # An ack: for our own probe, or one we relay for someone else.
        if probe is not None and msg.seq == probe.seq:
            self._probe = None
            self.health.apply(-1)
            return []
        relay = self._relays.pop(msg.seq, None)
        if relay is not None:
            return [self._message(Kind.ACK, relay.requester_address, relay.seq, relay.target)]
        return []

    def tick(self) -> list[Outgoing]:
        """Advance timers: probes, indirect probes, nacks, suspicion timeouts, reconnects and
        push-pulls. Returns what to send."""
        now = self.clock.now()
        out: list[Outgoing] = []
        probe = self._probe
        if probe is not None and not probe.indirect_sent and now >= probe.started + probe.timeout_s:
            probe.indirect_sent = True
            out += self._ping_reqs(probe)
        if probe is not None and now >= probe.started + probe.period_s:
            self._probe = None
            self._probe_failed(probe)
        if self._probe is None and now >= self._next_probe and not self.leaving:
            out += self._start_probe(now)
        for seq, relay in list(self._relays.items()):
            if not relay.nacked and now >= relay.nack_at:
                relay.nacked = True
                out.append(
                    self._message(Kind.NACK, relay.requester_address, relay.seq, relay.target)
                )
            if now >= relay.expires:
                del self._relays[seq]
        if not self.leaving:
            out += self._reconnect(now) + self._push_pull(now)
            if self._revived and now >= self._revival_push_pull_at + self.cfg.period_s:
                self._revival_push_pull_at = now
                out.append(self._message(Kind.PUSH_PULL, self._revived[-1], self._next_seq()))
        self._revived.clear()
        self._expire(now)
        return out

    def _probe_failed(self, probe: _Probe) -> None:
        # No nack from any helper either says that our own messages get lost (Lifeguard
        # §4.1). One nack is proof enough that we hear: the helpers that did not nack may be
        # across a partition, and counting each (as memberlist does) slows the side that can
        # still talk to itself, which then heals late.
        if probe.nacks == 0:
            self.health.apply(1)
        entry = self._members.get(probe.target)
        if (
            entry is not None
            and entry.record.live
            and entry.record.incarnation == probe.incarnation
        ):
            self._accuse(entry)
            self._members[probe.target].failed_at = self.clock.now()

    def _start_probe(self, now: float) -> list[Outgoing]:
        period_s = self.health.scale(self.cfg.period_s)
        self._next_probe = now + period_s
        target = self._next_target()
        if target is None:
            return []
        timeout_s = self.health.scale(self.cfg.ping_timeout_s)
        self._probe = _Probe(
            target.node_id, target.incarnation, self._next_seq(), now, timeout_s, period_s
        )
        return [self._message(Kind.PING, target.address, self._probe.seq, to=target.node_id)]

    def _next_target(self) -> MemberRecord | None:
        """A suspect we have not probed yet or whose suspicion is about to end, else round
        robin over a shuffled list, reshuffled each pass (SWIM §4.3).

        Probing a suspect ourselves means its answer, which carries its refutation, reaches us
        directly instead of depending on gossip that may die out before it gets here; and a
        suspicion ends in death only after a last probe of our own failed too.
        """
        now = self.clock.now()
        n = len(self._members) + 1
        lead_s = self._final_check_s()
        final, first = [], []
        for entry in map(self._members.__getitem__, self._suspects):
            deadline = self._suspicion_deadline(entry, n)
            if entry.probed_at < deadline - lead_s <= now:
                final.append((deadline, entry))
            elif entry.probed_at == -math.inf:
                first.append((deadline, entry))
        # Final checks first; first checks every other probe at most, so that the round robin
        # that finds crashes is not starved when loss makes many suspects.
        due = final or (first if not self._checked_last else [])
        self._checked_last = bool(due)
        if due:
            _, entry = min(due, key=lambda d: d[0])
            entry.probed_at = now
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
        probe.helpers = len(chosen)
        out = [self._message(Kind.PING_REQ, h.address, probe.seq, probe.target) for h in chosen]
        # And the target itself once more, as memberlist's fallback ping does: a lost ping or
        # ack is the likeliest reason for the silence.
        target = self._members.get(probe.target)
        if target is not None:
            out.append(self._message(Kind.PING, target.record.address, probe.seq, to=probe.target))
        return out

    def _reconnect(self, now: float) -> list[Outgoing]:
        """Push-pull with one member we hold dead, now and then: it may be back, or on the far
        side of a partition that has healed (Serf rejoins failed members the same way). Each
        member does so with probability dead / live, so that swarm-wide each dead member gets
        about one attempt per interval, as in Serf.

        A push-pull, not a ping: each side learns what the other holds of it and of everyone
        it knows, so both sides' members are suspected where they were dead, probed, and
        refute, instead of waiting to meet one by one."""
        if now < self._next_reconnect:
            return []
        self._next_reconnect = now + self.cfg.reconnect_interval_s
        dead = [
            e.record
            for e in map(self._members.__getitem__, self._gone)
            if e.record.status is Status.DEAD and not e.expelled
        ]
        live = len(self._members) - len(self._gone)
        if not dead or self.rng.random() >= len(dead) / max(live, 1):
            return []
        target = self.rng.choice(dead)
        return [self._message(Kind.PUSH_PULL, target.address, self._next_seq())]

    def _push_pull(self, now: float) -> list[Outgoing]:
        """Swap whole states with a random live member (memberlist's push-pull): it repairs
        whatever piggybacking missed, and tells each side what the other holds of it."""
        if now < self._next_push_pull:
            return []
        n = len(self._members) + 1
        self._next_push_pull = now + self.cfg.push_pull_period_s(n)
        alive = [e.record for e in self._members.values() if e.record.status is Status.ALIVE]
        if not alive:
            return []
        partner = self.rng.choice(alive)
        return [self._message(Kind.PUSH_PULL, partner.address, self._next_seq())]

    def _suspicion_deadline(self, entry: _Entry, n: int) -> float:
        low = self.cfg.suspicion_timeout_s(n)
        timeout = suspicion_timeout_s(
            low,
            low * self.cfg.suspicion_max_mult,
            len(entry.accusers) - 1,
            self.cfg.expected_confirmations(n),
        )
        return (entry.suspect_since or 0.0) + timeout

    def _final_check_s(self) -> float:
        """How long before a suspicion ends we probe the suspect once more: time for the probe
        to fail before the deadline."""
        return 2 * self.health.scale(self.cfg.period_s)

    def _expire(self, now: float) -> None:
        n = len(self._members) + 1
        lead_s = self._final_check_s()
        for node_id in list(self._suspects):
            entry = self._members[node_id]
            deadline = self._suspicion_deadline(entry, n)
            # Dead only if our own last probe failed too; until then the suspect is due a
            # probe (_next_target), and the deadline waits for it.
            if now >= deadline and entry.failed_at >= deadline - lead_s:
                self._set(entry, replace(entry.record, status=Status.DEAD), suspect=False)
        for node_id in list(self._gone):  # oldest first
            if now < self._members[node_id].changed_at + self.cfg.forget_after_s:
                break
            self._forget(node_id)

    def next_deadline(self) -> float:
        """The next time :meth:`tick` has something to do."""
        times = [math.inf]
        if not self.leaving:
            times += [self._next_probe, self._next_reconnect, self._next_push_pull]
            if self._revived:
                times.append(self._revival_push_pull_at + self.cfg.period_s)
        if self._probe is not None:
            if not self._probe.indirect_sent:
                times.append(self._probe.started + self._probe.timeout_s)
            times.append(self._probe.started + self._probe.period_s)
        times += [r.nack_at if not r.nacked else r.expires for r in self._relays.values()]
        n = len(self._members) + 1
        now = self.clock.now()
        lead_s = self._final_check_s()
        for entry in map(self._members.__getitem__, self._suspects):
            deadline = self._suspicion_deadline(entry, n)
            # A deadline passed waits for our last probe, whose own timers are above.
            times += [t for t in (deadline - lead_s, deadline) if t > now]
        return min(times)

    def expel(self, node_id: NodeId) -> None:
        """Declare ``node_id`` dead for good here (it was revoked): its record goes, and with
        a ``verify`` that refuses it, it cannot come back."""
        entry = self._members.get(node_id)
        if entry is not None and entry.record.live:
            record = replace(entry.record, status=Status.DEAD)
            self._set_entry(_Entry(record, self.clock.now(), expelled=True))
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
